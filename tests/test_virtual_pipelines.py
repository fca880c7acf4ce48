"""Today's pipeline schemes simulated by the shared runner: the closed forms of their
papers (interleaved 1F1B's bubble shrinks by v, ZB-H1's is a third of 1F1B's at 1F1B's
memory, ZB-V has none), the unit-step dry run, memory with the W passes' held activations,
bytes per link, the partition into virtual stages and the errors for what a schedule
cannot take."""

import pytest

from analysis.report import run_section
from simcore import SimConfig, simulate
from simcore import pipeline_schedules as ps
from simcore.config import ConfigError, options_from_mapping
from simcore.schemes import get_scheme
from tests.helpers import ring_topology
from tests.test_cli import run_main
from traces import Layer, TraceMeta, chain

BW = 1e15
"""Fast enough that messages take no time that matters (the closed forms ignore them)."""


def run(scheme, n, layers, f, b, m, params=1000, act=0, iterations=2, bw=BW, **opts):
    """``scheme`` on ``n`` GPUs over ``layers`` equal layers (per-batch times f, b) after
    an input of their activations' size, one layer per stage (partition by layers), ``m``
    micro-batches: a micro-batch in flight holds ``2 * act / m`` on every GPU, its stage's
    input and output."""
    trace = chain(
        TraceMeta("toy", "V100", 64),
        [Layer("data", 0.0, 0.0, activation_bytes=act, kind="input")]
        + [Layer(f"l{i}", f, b, param_bytes=params, activation_bytes=act) for i in range(layers)],
    )
    cls = get_scheme(scheme)
    given = {"microbatches": m, "partition": "layers", **opts}
    options = options_from_mapping(cls.Options, given)
    return simulate(
        SimConfig(
            trace=trace,
            topology=ring_topology(n, bw, 0.0),
            scheme=scheme,
            options=options,
            iterations=iterations,
        )
    )


@pytest.mark.parametrize(("n", "m"), [(2, 4), (3, 6), (4, 8), (4, 12)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_bubble_shrinks_by_v(n, m, v):
    """Megatron's closed form: with v chunks per GPU each a v-th of a 1F1B stage, an
    iteration is (vM + N - 1) chunk passes; the bubble (N-1) chunk times is 1/v of
    1F1B's (gpipe's flush has 1F1B's length), a fraction (N-1)/(vM + N - 1)."""
    f, b = 1.0, 2.0
    chunk = (f + b) / m
    r = run("interleaved", n, n * v, f, b, m, chunks=v)
    assert r.iteration_time_s == pytest.approx((v * m + n - 1) * chunk, rel=1e-6)
    assert r.bubble_fraction == pytest.approx((n - 1) / (v * m + n - 1), rel=1e-6)
    flat = run("gpipe", n, n * v, f, b, m)
    bubble_1f1b = flat.iteration_time_s - m * v * chunk
    bubble = r.iteration_time_s - m * v * chunk
    assert bubble == pytest.approx(bubble_1f1b / v, rel=1e-6)
    assert r.extra["stages"] == n * v and r.extra["chunks"] == v


@pytest.mark.parametrize(("n", "m"), [(2, 4), (3, 6), (4, 8), (4, 12), (6, 9)])
def test_zb_h1_bubble_is_a_third_of_1f1bs_at_1f1bs_memory(n, m):
    """The zero-bubble paper with T_F = T_I = T_W (a backward twice the forward, split in
    half): ZB-H1 takes 3M + N - 1 pass times, synchronous 1F1B 3(M + N - 1) (GPipe's
    time); ZB-H1's bubble N - 1 is a third of 1F1B's. 1F1B holds N - r micro-batches on
    GPU r; ZB-H1 holds N on every GPU: 1F1B's peak, on its first GPU."""
    u = 1.0 / m
    act = 1 << 20
    held = 2 * act / m  # a micro-batch's input and activations
    zb = run("zb-h1", n, n, 1.0, 2.0, m, act=act)
    assert zb.iteration_time_s == pytest.approx((3 * m + n - 1) * u, rel=1e-6)
    ofob = run("1f1b", n, n, 1.0, 2.0, m, act=act)
    assert ofob.iteration_time_s == pytest.approx(3 * (m + n - 1) * u, rel=1e-6)
    assert ofob.iteration_time_s == pytest.approx(
        run("gpipe", n, n, 1.0, 2.0, m).iteration_time_s, rel=1e-6
    )
    assert (zb.iteration_time_s - 3 * m * u) * 3 == pytest.approx(
        ofob.iteration_time_s - 3 * m * u, rel=1e-6
    )
    static = ofob.per_gpu_peak_memory_bytes[-1] - held
    assert list(ofob.per_gpu_peak_memory_bytes) == pytest.approx(
        [static + min(n - r, m) * held for r in range(n)], abs=n
    )
    assert list(zb.per_gpu_peak_memory_bytes) == pytest.approx(
        [static + min(n, m) * held] * n, abs=n
    )
    assert list(zb.extra["activation_peak_bytes"]) == pytest.approx([min(n, m) * held] * n, abs=1)
    assert max(zb.per_gpu_peak_memory_bytes) == pytest.approx(
        max(ofob.per_gpu_peak_memory_bytes), abs=n
    )


def test_the_report_shows_the_zero_bubble_papers_direction(tmp_path):
    """``sim report``'s zero-bubble table (quick: GNMT on 4 GPUs): ZB-H1 faster than
    1F1B at about its memory (within 5%)."""
    from analysis.report import sections

    sec = next(s for s in sections() if s.key == "zero-bubble")
    text, missing, computed = run_section(sec, str(tmp_path), True, 1, False)
    assert missing == "" and computed == len(sec.schemes)
    row = next(ln for ln in text.splitlines() if ln.startswith("| gnmt |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    ofob, zb = cells[1], cells[2]
    ratio = float(zb.split("(")[1].split("x")[0])
    mem = [float(c.split(", ")[1].split()[0]) for c in (ofob, zb)]
    assert ratio > 1.0 and mem[1] <= 1.05 * mem[0]


@pytest.mark.parametrize(("n", "m"), [(2, 4), (3, 6), (3, 9), (4, 8), (4, 12)])
def test_zbv_has_no_bubble_when_passes_take_equally_long(n, m):
    """The paper's section 6: with T_F = T_I = T_W and M >= 2N - 1, ZB-V keeps every GPU
    busy in steady state; an iteration is the 6M chunk passes of each GPU."""
    r = run("zbv", n, 2 * n, 1.0, 2.0, m)
    assert r.iteration_time_s == pytest.approx(6 * m * (1.0 / m), rel=1e-6)
    assert all(u == pytest.approx(1.0, abs=1e-9) for u in r.per_gpu_utilization)


def test_the_papers_ordering_at_equal_pass_times():
    """ZB-V <= DualPipeV <= interleaved zero bubble < interleaved 1F1B at the same GPUs,
    chunks and micro-batches (T_F = T_I = T_W); ZB-H1 < 1F1B on one stage per GPU."""
    n, m = 4, 8
    t = {
        s: run(s, n, 2 * n, 1.0, 2.0, m, **({"chunks": 2} if "inter" in s else {})).iteration_time_s
        for s in ("zbv", "dualpipev", "zb-interleaved", "interleaved")
    }
    assert t["zbv"] <= t["dualpipev"] <= t["zb-interleaved"] < t["interleaved"]
    assert (
        run("zb-h1", n, n, 1.0, 2.0, m).iteration_time_s
        < run("gpipe", n, n, 1.0, 2.0, m).iteration_time_s
    )


@pytest.mark.parametrize("scheme", ["zb-h1", "zb-interleaved", "zbv", "looped-bfs"])
def test_one_iteration_takes_as_long_as_the_unit_step_dry_run(scheme):
    """When every pass takes one unit and messages none, the simulator's first iteration
    (from an empty pipeline; the measured ones after it may overlap the next iteration's
    start) is the schedule's dry run: the grid's steps (full backwards take one unit
    too: looped-bfs with T_B = T_F; the others split every backward, T_I = T_W = T_F)."""
    n, m = 3, 6
    chunks = ps.FIXED_CHUNKS.get(scheme, 2)
    b = 1.0 if scheme == "looped-bfs" else 2.0
    opts = {} if scheme in ps.FIXED_CHUNKS else {"chunks": chunks}
    r = run(scheme, n, n * chunks, 1.0, b, m, iterations=1, **opts)
    steps = len(ps.make(scheme, n, chunks, m).grid().splitlines()[1].split()) - 1
    assert r.iteration_times_s[0] == pytest.approx(steps / m, rel=1e-6)


def test_activations_are_held_until_the_w_pass():
    """Looped BFS holds all M micro-batches of each of its v chunks; ZB-H1 frees a
    micro-batch's activations at its W, not its I: with one micro-batch per rank in flight
    it would be less."""
    n, m, v, act = 2, 4, 2, 1 << 20
    bfs = run("looped-bfs", n, n * v, 1.0, 1.0, m, act=act, chunks=v)
    base = run("looped-bfs", n, n * v, 1.0, 1.0, m, act=0, chunks=v)
    assert all(
        p - q == 2 * v * act  # each chunk holds its M micro-batches' inputs and outputs
        for p, q in zip(bfs.per_gpu_peak_memory_bytes, base.per_gpu_peak_memory_bytes)
    )
    zb = run("zb-h1", n, n, 1.0, 2.0, m, act=act)
    zb0 = run("zb-h1", n, n, 1.0, 2.0, m, act=0)
    # the last rank: F0 I0 F1 I1 W0 ...: two micro-batches held (1F1B's B would free one),
    # each its input and its activations
    assert zb.per_gpu_peak_memory_bytes[-1] - zb0.per_gpu_peak_memory_bytes[-1] == 4 * act // m


@pytest.mark.parametrize(
    ("scheme", "v", "boundaries"),
    [
        ("gpipe", 1, lambda n: n - 1),
        ("interleaved", 3, lambda n: 3 * n - 1),
        ("zbv", 2, lambda n: 2 * n - 2),
        ("dualpipev", 2, lambda n: 2 * n - 2),
    ],
)
def test_bytes_cross_every_stage_boundary_between_gpus(scheme, v, boundaries):
    """Each micro-batch's activation and gradient cross every boundary between two
    stages on different GPUs once (a V's turn stays on its GPU): 2 x boundaries x A per
    iteration for a layer output of A bytes."""
    n, m, act = 4, 8, 8 << 20
    opts = {"chunks": v} if scheme == "interleaved" else {}
    r = run(scheme, n, n * v, 1.0, 2.0, m, act=act, **opts)
    assert r.comm_bytes_per_iteration == pytest.approx(2 * boundaries(n) * act, rel=1e-6)


def test_the_partition_cuts_v_chunks_per_gpu_and_balances_them():
    """Antichain over v x N stages: on a chain of unequal layers the chunks are balanced
    (the slowest is at most the largest layer plus the mean) and placed as the schedule
    says."""
    times = [(0.001 * (1 + i % 3), 0.002 * (1 + i % 3)) for i in range(24)]
    trace = chain(
        TraceMeta("toy", "V100", 64),
        [Layer(f"l{i}", f, b, param_bytes=1000) for i, (f, b) in enumerate(times)],
    )
    cls = get_scheme("zbv")
    r = simulate(
        SimConfig(
            trace=trace,
            topology=ring_topology(4, 10e9, 0.0),
            scheme="zbv",
            options=options_from_mapping(cls.Options, {"microbatches": 8}),
            iterations=1,
        )
    )
    assert r.extra["stages"] == 8 and r.extra["rank_stages"] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    per_stage = r.extra["stage_time_s"]
    mean = sum(f + b for f, b in times) / 8 / 8
    assert max(per_stage) <= mean + 0.009 / 8 + 1e-12
    assert sum(len(x) for x in r.extra["rank_stages"]) == 8


def test_chunks_that_do_not_fit_the_layers_are_refused():
    with pytest.raises(ConfigError, match=r"scheme.chunks.*at most 2 with 4 GPUs.*10 layers"):
        run("interleaved", 4, 10, 1.0, 2.0, 8, chunks=3)
    with pytest.raises(ConfigError, match=r"gpus.*at most 3.*7 layers to split into 2"):
        run("zbv", 4, 7, 1.0, 2.0, 8)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--scheme", "dualpipev", "--gpus", "4", "--set", "scheme.microbatches=5"],
            "scheme.microbatches: 5 is not allowed; DualPipeV needs at least as many "
            "micro-batches as stages: 5 < 2 x 4 ranks; use 8 or more",
        ),
        (
            ["--scheme", "interleaved", "--gpus", "4", "--set", "scheme.microbatches=9"],
            "9 micro-batches do not split into 2 equal rounds",
        ),
        (
            ["--scheme", "interleaved", "--gpus", "8", "--set", "scheme.chunks=40"],
            "scheme.chunks: 40 is not allowed; at most 5 with 8 GPUs",
        ),
    ],
)
def test_bad_input_is_one_line_naming_what_works(capsys, args, message):
    code, out, err = run_main(capsys, "run", "--model", "gnmt", *args)
    assert code == 2 and out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("scheme", list(ps.SCHEDULES))
def test_every_schedule_runs_on_gnmt_with_8_gpus(capsys, scheme):
    code, out, err = run_main(capsys, "run", "--scheme", scheme, "--gpus", "8", "--model", "gnmt")
    assert code == 0, err
    assert "bubble / idle" in out


@pytest.mark.parametrize("scheme", ["zbv", "interleaved", "zb-h1"])
def test_sim_schedule_compares_with_torch(capsys, scheme):
    pytest.importorskip("torch.distributed.pipelining")
    args = ("--stages", "3", "--microbatches", "6", "--compare-torch")
    code, out, err = run_main(capsys, "schedule", "--scheme", scheme, *args)
    assert code == 0, err
    assert "equal torch's" in out and out.count("rank2") == 2
