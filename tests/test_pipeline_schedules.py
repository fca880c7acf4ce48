"""Today's pipeline schedules as data: our generators against torch's own
(``torch.distributed.pipelining`` 2.13) pass for pass, ZB-H1 against the zero-bubble
paper, torch's action strings and CSV in and out, virtual stages in the validator."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore import pipeline_schedules as ps
from simcore.schedule import (
    Action,
    Schedule,
    ScheduleError,
    compute_passes,
    from_torch,
    from_torch_csv,
    placement,
    to_torch_csv,
    to_torch_rows,
    with_comms,
)

SHAPES = [(2, 4), (3, 6), (4, 8), (4, 12), (5, 10)]
"""(ranks, micro-batches) every schedule is compared at (DualPipeV needs M >= 2N)."""
TORCH_SCHEMES = ["interleaved", "looped-bfs", "zb-interleaved", "zbv", "dualpipev"]


def torch_order(name: str, ranks: int, chunks: int, microbatches: int) -> list[list[str]]:
    pytest.importorskip("torch.distributed.pipelining.schedules")
    from realrun.torch_schedules import torch_order as order

    return order(name, ranks, chunks, microbatches)


@pytest.mark.parametrize("name", TORCH_SCHEMES)
@pytest.mark.parametrize(("ranks", "microbatches"), SHAPES)
def test_generators_equal_torchs(name, ranks, microbatches):
    chunks_list = [ps.FIXED_CHUNKS[name]] if name in ps.FIXED_CHUNKS else [2, 3]
    for chunks in chunks_list:
        ours = ps.make(name, ranks, chunks, microbatches)
        ours.validate()
        want = torch_order(name, ranks, chunks, microbatches)
        assert [compute_passes(ours, r) for r in range(ranks)] == want
        # and torch's order read back is ours, sends and receives included
        assert (
            from_torch(want, name).actions
            == with_comms(name, ours.stages, _passes(ours), microbatches, updates=False).actions
        )


def _passes(s: Schedule) -> list[list[Action]]:
    return [[a for a in acts if a.kind in "FBIW"] for acts in s.actions]


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (3, 6), (4, 8), (4, 3)])
def test_zb_h1_is_torchs_zero_bubble_on_one_stage_per_rank(ranks, microbatches):
    ours = ps.make("zb-h1", ranks, 1, microbatches)
    want = torch_order("zb-h1", ranks, 1, microbatches)
    assert [compute_passes(ours, r) for r in range(ranks)] == want


def test_zb_h1_is_the_papers_figure():
    """ZB-H1 as the zero-bubble paper (arXiv 2401.10241, section 2.1 and Figure 3, top)
    describes it, 4 stages, 8 micro-batches, F = I = W = one step, the grid written out
    here from its rule (1F1B's order, stage i's W passes delayed by the i warm-up
    micro-batches it has fewer than the first): the last stage holds its first three W
    back, the first none. 3M + (N - 1) steps: the bubble is N - 1 steps per rank, a third
    of 1F1B's 3(N - 1), the paper's number."""
    s = ps.make("zb-h1", 4, 1, 8)
    rows = [line.split()[1:] for line in s.grid().splitlines()[1:]]
    assert " ".join(rows[3]) == (
        ". . . F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7"
    )
    assert " ".join(rows[0]) == (
        "F0 F1 F2 F3 . . . I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7"
    )
    assert all(len(row) == 3 * 8 + 3 and row.count(".") == 3 for row in rows)


def test_zb_h1_keeps_1f1bs_in_flight_count():
    """Every rank holds at most N micro-batches whose W has not run: 1F1B's first rank."""
    n = 5
    s = ps.make("zb-h1", n, 1, 12)
    for acts in s.actions:
        open_, peak = 0, 0
        for a in acts:
            open_ += (a.kind == "F") - (a.kind == "W")
            peak = max(peak, open_)
        assert peak <= n


def test_placements():
    assert placement(3, 2, "loop") == ((0,), (1,), (2,), (0,), (1,), (2,))
    assert placement(3, 2, "v") == ((0,), (1,), (2,), (2,), (1,), (0,))
    assert placement(2, 3, "v") == ((0,), (1,), (1,), (0,), (0,), (1,))
    with pytest.raises(ScheduleError, match="loop, v"):
        placement(2, 2, "zigzag")


def test_v_placement_needs_no_send_at_the_turn():
    s = ps.make("zbv", 3, 2, 6)
    turn = [str(a) for a in s.actions[2] if a.kind in ("SA", "RA", "SG", "RG")]
    assert not any(t.startswith(("2SA", "3RA", "3SG", "2RG")) for t in turn)
    assert "3SA0>1" in turn and "4RA0<2" in s.to_text()


def test_torch_strings_and_csv_round_trip():
    s = ps.make("dualpipev", 3, 2, 6)
    rows = to_torch_rows(s)
    assert rows[1][:3] == ["1RECV_F0", "1F0", "1SEND_F0"]
    assert any(x.startswith(("4RECV_F", "4SEND_B", "1RECV_B")) for x in rows[1])
    back = from_torch_csv(to_torch_csv(s, compute_only=True), "dualpipev")
    assert [compute_passes(back, r) for r in range(3)] == [compute_passes(s, r) for r in range(3)]
    assert back.stages == s.stages
    back.validate()
    # torch's overlapped pair reads as its two passes; FSDP's bookkeeping is skipped
    two = from_torch([["0F0", "0UNSHARD", "0F1", "0I0", "0W0", "0B1"]])
    assert compute_passes(two, 0) == ["0F0", "0F1", "0I0", "0W0", "0B1"]
    ov = from_torch([["0F0", "(0F1;0B0)OVERLAP_F_B", "0B1", "0REDUCE_GRAD"]])
    assert compute_passes(ov, 0) == ["0F0", "0F1", "0B0", "0B1"]


@pytest.mark.parametrize("bad", ["F0", "0X1", "0SEND_F", "(0F1;0Q)OVERLAP_F_B"])
def test_bad_torch_strings_are_named(bad):
    with pytest.raises(ScheduleError, match="cannot read torch action"):
        from_torch([[bad]])


def test_text_form_round_trips_virtual_stages():
    s = ps.make("interleaved", 2, 2, 4, iterations=2)
    text = s.to_text()
    assert text.startswith("rank 0 (stages 0,2): 0F0 0SA0>1 ")
    back = Schedule.from_text(text, per_iteration=4)
    assert back.actions == s.actions and back.stages == s.stages
    for token in ("1I3", "0W2"):
        assert str(Action.parse(token)) == token


def test_validator_checks_the_split_backward():
    s = ps.make("zb-h1", 2, 1, 2)
    no_w = tuple(tuple(a for a in acts if str(a) != "1W1") for acts in s.actions)
    with pytest.raises(ScheduleError, match=r"micro-batch 1 has no weight-gradient pass \(W\)"):
        Schedule("x", s.stages, 2, 2, no_w).validate()
    early = list(s.actions[0])
    w = early.pop(next(i for i, a in enumerate(early) if str(a) == "0W0"))
    early.insert(1, w)
    with pytest.raises(ScheduleError, match=r"W\) of micro-batch 0 without its input-gradient"):
        Schedule("x", s.stages, 2, 2, (tuple(early), s.actions[1])).validate()
    wrong = ((Action("F", 1, 0),), s.actions[1])
    with pytest.raises(ScheduleError, match="rank 0 runs stage 0, not 1"):
        Schedule("x", s.stages, 2, 2, wrong).validate()


@pytest.mark.parametrize(
    ("name", "ranks", "chunks", "mbs", "message"),
    [
        ("dualpipev", 4, 2, 7, r"at least as many micro-batches as stages: 7 < 2 x 4 .*use 8"),
        ("interleaved", 4, 2, 9, r"9 micro-batches do not split into 2 equal rounds.*8, 10"),
        ("zb-interleaved", 4, 2, 9, "equal rounds"),
        ("zbv", 4, 3, 8, "zbv runs 2 stage"),
        ("gpipe", 4, 1, 8, "choose one of 1f1b, interleaved"),
    ],
)
def test_what_a_schedule_cannot_take_is_named(name, ranks, chunks, mbs, message):
    with pytest.raises(ScheduleError, match=message):
        ps.make(name, ranks, chunks, mbs)


@pytest.mark.parametrize("name", list(ps.SCHEDULES))
def test_iterations_repeat_with_updates(name):
    chunks = ps.FIXED_CHUNKS.get(name, 2)
    s = ps.make(name, 3, chunks, 6, iterations=2)
    s.validate()
    assert compute_passes(s, 1, iteration=1) == compute_passes(s, 1, iteration=0)
    ups = [a for a in s.actions[0] if a.kind == "U"]
    assert len(ups) == 2 * chunks and {a.mb for a in ups} == {5, 11}


@pytest.mark.parametrize(("ranks", "microbatches"), [(2, 4), (4, 8), (4, 2)])
def test_1f1b_is_zb_h1_with_the_backward_whole(ranks, microbatches):
    """Synchronous 1F1B: N-1-r warm-up forwards, then F and B in turn, then the drain;
    ZB-H1 is the same order with each B split into I (and its W later)."""
    ofob = ps.make("1f1b", ranks, 1, microbatches)
    zb = ps.make("zb-h1", ranks, 1, microbatches)
    ofob.validate()
    for r in range(ranks):
        whole = [p.replace("I", "B") for p in compute_passes(zb, r) if "W" not in p]
        assert compute_passes(ofob, r) == whole
    last = ranks - 1
    assert compute_passes(ofob, last)[:4] == [f"{last}F0", f"{last}B0", f"{last}F1", f"{last}B1"]
    if microbatches >= ranks:
        assert compute_passes(ofob, 0)[ranks - 1 : ranks + 1] == [f"0F{ranks - 1}", "0B0"]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(ps.SCHEDULES)),
    ranks=st.integers(1, 6),
    chunks=st.integers(1, 4),
    microbatches=st.integers(1, 20),
)
def test_every_schedule_it_makes_is_sound(name, ranks, chunks, microbatches):
    """Whatever shape a generator accepts, its schedule validates (each stage and
    micro-batch: one F, then B or I and W; every send received; no deadlock), every rank
    runs exactly its placed stages, and a shape it refuses is refused with a reason."""
    chunks = ps.FIXED_CHUNKS.get(name, chunks)
    try:
        s = ps.make(name, ranks, chunks, microbatches)
    except ScheduleError as exc:
        assert str(exc)
        return
    s.validate()
    style = ps.SCHEDULES[name][0]
    assert s.stages == placement(ranks, chunks, style)
    for r, mine in enumerate(s.local_stages()):
        ran = {a.stage for a in s.actions[r] if a.kind == "F"}
        assert ran == set(mine)
        assert sum(a.kind == "F" for a in s.actions[r]) == len(mine) * microbatches
