"""Schedules as data: the text form, the generators' shapes, the validator's findings and
properties over stages and micro-batches."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.schedule import (
    BACKWARD,
    FORWARD,
    Action,
    Schedule,
    ScheduleError,
    gpipe,
    one_f_one_b,
    stages_from_replicas,
    straight_stages,
)


def passes(s: Schedule, rank: int) -> list[str]:
    return [a.label for a in s.actions[rank] if a.kind in (FORWARD, BACKWARD)]


def test_text_form_round_trips():
    s = one_f_one_b(stages_from_replicas([2, 1, 1]), 4, iterations=2)
    text = s.to_text()
    assert text.splitlines()[2].startswith("rank 2 (stage 1): 1RA0<0 1F0 1SA0>3 ")
    back = Schedule.from_text(text, per_iteration=4)
    assert back.actions == s.actions and back.stages == s.stages
    assert back.microbatches == 8
    for token in ("0F3", "1B0", "2SA3>3", "3RA3<2", "0U7", "1L2", "2P5", "0R4", "0AR6"):
        assert str(Action.parse(token)) == token


@pytest.mark.parametrize("bad", ["F3", "0X3", "0SA3", "0F3>1", "0RA3>1"])
def test_malformed_actions_are_named(bad):
    with pytest.raises(ScheduleError, match=r"cannot read action|sends take|only sends"):
        Action.parse(bad)


def test_1f1b_warms_up_then_alternates():
    s = one_f_one_b(straight_stages(4), 8)
    assert passes(s, 0)[:6] == ["F0", "F1", "F2", "F3", "B0", "F4"]
    assert passes(s, 2)[:5] == ["F0", "F1", "B0", "F2", "B1"]
    assert passes(s, 3)[:4] == ["F0", "B0", "F1", "B1"]
    # every backward is followed by the stage's update; stashing loads the version first
    acts = [str(a) for a in s.actions[1]]
    i = acts.index("1B0")
    assert acts[i - 1] == "1L0" and acts[i + 2] == "1U0"


def test_1f1b_grid_matches_the_textbook_picture():
    grid = one_f_one_b(straight_stages(3), 4).grid().splitlines()
    assert grid[1].split()[1:] == [
        "F0",
        "F1",
        "F2",
        ".",
        ".",
        "B0",
        "F3",
        "B1",
        ".",
        "B2",
        ".",
        "B3",
    ]
    assert grid[3].split()[1:] == [
        ".",
        ".",
        "F0",
        "B0",
        "F1",
        "B1",
        "F2",
        "B2",
        "F3",
        "B3",
        ".",
        ".",
    ]


def test_gpipe_grid_takes_two_times_m_plus_n_minus_one_steps():
    n, m = 4, 5
    grid = gpipe(straight_stages(n), m).grid().splitlines()
    assert grid[0].split()[-1] == str(2 * (m + n - 1) - 1)
    assert grid[1].split()[1 : m + 1] == [f"F{i}" for i in range(m)]
    assert grid[4].split()[n : n + 2 * m] == [f"F{i}" for i in range(m)] + [
        f"B{i}" for i in range(m)
    ]


def test_recompute_reruns_the_forward_before_each_backward():
    s = gpipe(straight_stages(2), 2, recompute=True)
    labels = [a.label for a in s.actions[0] if a.kind in "FBR"]
    assert labels == ["F0", "F1", "R0", "B0", "R1", "B1"]
    s.validate()


def test_validator_reports_backward_before_forward():
    s = gpipe(straight_stages(2), 2)
    acts = list(s.actions[1])
    acts.remove(Action(FORWARD, 1, 1))
    acts.insert(len(acts) - 1, Action(FORWARD, 1, 1))
    bad = Schedule("x", s.stages, 2, 2, (s.actions[0], tuple(acts)))
    with pytest.raises(
        ScheduleError,
        match=r"rank 1, step \d+ \(1B1\): backward of "
        r"micro-batch 1 without a forward",
    ):
        bad.validate()


def test_validator_reports_unmatched_send():
    s = gpipe(straight_stages(2), 1)
    acts = [a for a in s.actions[1] if a.kind != "RA"]
    bad = Schedule("x", s.stages, 1, 1, (s.actions[0], tuple(acts)))
    with pytest.raises(ScheduleError, match=r"0SA0>1 has no matching receive 1RA0<0 on rank 1"):
        bad.validate()


def test_validator_finds_a_deadlock_and_draws_where():
    """Stage 1 waits for the gradient of micro-batch 1 before forwarding micro-batch 1."""
    text = (
        "rank 0 (stage 0): 0F0 0SA0>1 0F1 0SA1>1 0RG0<1 0B0 0RG1<1 0B1 0U1\n"
        "rank 1 (stage 1): 1RA0<0 1F0 1RG1<2 1SA0>2 1RA1<0 1F1 1SA1>2 1RG0<2 1B0 "
        "1SG0>0 1B1 1SG1>0 1U1\n"
        "rank 2 (stage 2): 2RA0<1 2F0 2B0 2SG0>1 2RA1<1 2F1 2B1 2SG1>1 2U1"
    )
    s = Schedule.from_text(text)
    with pytest.raises(ScheduleError) as err:
        s.validate()
    msg = str(err.value)
    assert msg.startswith(
        "deadlock at step 2: rank 0 (its action 4, 0RG0<1) waits for the "
        "gradient of micro-batch 0 from rank 1; rank 1 (its action 2, "
        "1RG1<2) waits for the gradient of micro-batch 1 from rank 2; "
        "rank 2 (its action 0, 2RA0<1) waits"
    )
    grid = msg.splitlines()[1:]
    assert grid[1].split() == ["rank0", "F0", "F1", "!"]
    assert grid[2].split() == ["rank1", ".", "F0", "!"]


def test_replicas_must_join_the_same_allreduces():
    s = one_f_one_b(stages_from_replicas([2, 1]), 2)
    acts = [a for a in s.actions[1] if a.kind != "AR"]
    bad = Schedule("x", s.stages, 2, 2, (s.actions[0], tuple(acts), s.actions[2]))
    with pytest.raises(ScheduleError, match="do not join the same all-reduces"):
        bad.validate()


def test_replicated_stages_need_whole_rounds():
    with pytest.raises(ScheduleError, match="multiple"):
        one_f_one_b(stages_from_replicas([3, 1]), 4)


@settings(max_examples=60, deadline=None)
@given(
    reps=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    rounds=st.integers(1, 4),
    iterations=st.integers(1, 3),
    kind=st.sampled_from(["1f1b", "gpipe", "stale"]),
    flag=st.booleans(),
)
def test_every_generated_schedule_validates(reps, rounds, iterations, kind, flag):
    """For any stages, replicas and micro-batches: each forward precedes its backward on
    its rank, every micro-batch passes every stage once, sends match receives, and the
    dry run never deadlocks."""
    stages = stages_from_replicas(reps)
    m = rounds * math.lcm(*reps)
    if kind == "gpipe":
        s = gpipe(stages, m, iterations, recompute=flag)
    else:
        s = one_f_one_b(stages, m, iterations, stash=kind == "1f1b", predict=flag)
    s.validate()
    for r, acts in enumerate(s.actions):
        seen = set()
        for a in acts:
            if a.kind == FORWARD:
                seen.add(a.mb)
            elif a.kind == BACKWARD:
                assert a.mb in seen, (r, a)
    cells = s.grid().splitlines()[1:]
    assert len(cells) == sum(reps)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), m=st.integers(1, 10))
def test_straight_1f1b_keeps_at_most_n_minus_k_in_flight(n, m):
    s = one_f_one_b(straight_stages(n), m)
    for k in range(n):
        in_flight = peak = 0
        for a in s.actions[k]:
            in_flight += (a.kind == FORWARD) - (a.kind == BACKWARD)
            peak = max(peak, in_flight)
        assert peak == min(n - k, m)
