"""The pipeline schemes on the shared runner: closed forms (GPipe step and bubble, 1F1B
throughput, model-parallel utilisation), properties over stages and micro-batches, the
memory model and communication over the topology."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import SimConfig, simulate
from simcore.config import ConfigError
from simcore.device import MEMORY_KINDS, MemoryAccount
from simcore.records import BACKWARD, FORWARD, RECOMPUTE
from simcore.schedule import version_difference
from simcore.schemes.gpipe import GPipeOptions
from simcore.schemes.mp import ModelParallel
from simcore.schemes.pipedream import PipeDreamOptions
from tests.helpers import ring_topology
from traces import Layer, TraceMeta, chain, load_builtin

BW = 10e9


def layers(times, params=0, act=0, batch=64):
    """A chain with one layer per (forward, backward) pair."""
    return chain(
        TraceMeta("toy", "V100", batch),
        [
            Layer(f"l{i}", f, b, param_bytes=params, activation_bytes=act)
            for i, (f, b) in enumerate(times)
        ],
    )


def run(trace, scheme, n, options=None, **kw):
    kw.setdefault("iterations", 3)
    return simulate(
        SimConfig(
            trace=trace, topology=ring_topology(n, BW, 0.0), scheme=scheme, options=options, **kw
        )
    )


@pytest.mark.parametrize(("n", "m"), [(2, 1), (2, 4), (4, 1), (4, 8), (3, 5)])
def test_gpipe_step_and_bubble_for_equal_stages(n, m):
    """(M+N-1)(t_f+t_b) per step and a bubble of (N-1)/(M+N-1), with t_f, t_b the
    per-micro-batch times (the trace's over M)."""
    f, b = 0.012, 0.03
    r = run(layers([(f, b)] * n), "gpipe", n, GPipeOptions(microbatches=m))
    assert r.extra["stages"] == n and r.extra["microbatches"] == m
    assert r.iteration_time_s == pytest.approx((m + n - 1) * (f + b) / m, rel=1e-12)
    assert r.bubble_fraction == pytest.approx((n - 1) / (m + n - 1), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), m=st.integers(1, 9))
def test_gpipe_closed_form_over_n_and_m(n, m):
    f, b = 0.004, 0.008
    r = run(layers([(f, b)] * n), "gpipe", n, GPipeOptions(microbatches=m), iterations=2)
    assert r.iteration_time_s == pytest.approx((m + n - 1) * (f + b) / m, rel=1e-9)
    assert r.bubble_fraction == pytest.approx((n - 1) / (m + n - 1), rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 6])
def test_model_parallelism_keeps_one_gpu_busy(n):
    f, b = 0.01, 0.02
    r = run(layers([(f, b)] * n), "mp", n)
    assert r.iteration_time_s == pytest.approx(n * (f + b), rel=1e-12)
    assert r.gpu_utilization == pytest.approx(1 / n, rel=1e-9)
    assert r.speedup == pytest.approx(1.0)
    assert ModelParallel.name == "mp"


@pytest.mark.parametrize("scheme", ["pipedream", "spectrain"])
def test_1f1b_steady_state_runs_at_the_bottleneck_stage(scheme):
    """With free communication each steady-state iteration (M micro-batches) takes M times
    the slowest stage's time per micro-batch: throughput = 1 / bottleneck."""
    times = [(0.01, 0.02), (0.02, 0.03), (0.005, 0.01), (0.01, 0.01)]
    opts = PipeDreamOptions(straight=True, microbatches=6) if scheme == "pipedream" else None
    r = run(layers(times), scheme, 4, opts, iterations=4, warmup_iterations=2)
    bottleneck = max(f + b for f, b in times)
    assert r.iteration_time_s == pytest.approx(bottleneck, rel=1e-12)
    for t in r.iteration_times_s[2:]:
        assert t == pytest.approx(bottleneck, rel=1e-9)
    per_mb = bottleneck / r.extra["microbatches"]
    assert r.throughput_samples_s == pytest.approx(64 / bottleneck)
    assert r.extra["bottleneck_stage_s"] == pytest.approx(per_mb)


@settings(max_examples=25, deadline=None)
@given(
    times=st.lists(
        st.tuples(st.floats(0.001, 0.05), st.floats(0.001, 0.05)), min_size=1, max_size=5
    ),
    m=st.integers(1, 8),
    scheme=st.sampled_from(["gpipe", "pipedream", "spectrain", "mp"]),
    act=st.integers(0, 4_000_000),
    params=st.integers(0, 50_000_000),
)
def test_pipelines_never_beat_their_bottleneck_and_memory_stays_sane(times, m, scheme, act, params):
    """Whatever the stages: an iteration takes at least M times the slowest stage per
    micro-batch, every forward of a micro-batch ends before its backward starts on the
    same GPU, no memory account is ever asked to free more than it holds (it would go
    negative), and weights, gradients and momentum are always counted."""
    n = len(times)
    trace = layers(times, params=params, act=act)
    opts = {
        "gpipe": GPipeOptions(microbatches=m),
        "pipedream": PipeDreamOptions(microbatches=m, straight=True),
    }.get(scheme)
    overdrawn = []
    free = MemoryAccount.free

    def checked_free(self, kind, nbytes):
        if nbytes > self.held[kind] + 1e-6:  # the account would go negative
            overdrawn.append((kind, nbytes, self.held[kind]))
        free(self, kind, nbytes)

    MemoryAccount.free = checked_free
    try:
        r = run(trace, scheme, n, opts, iterations=2, warmup_iterations=1)
    finally:
        MemoryAccount.free = free
    assert overdrawn == []
    slowest = max(f + b for f, b in times)
    assert r.iteration_time_s >= slowest * (1 - 1e-9)
    ends: dict[tuple[str, int, int], float] = {}
    for s in r.span_records():
        if s.kind == FORWARD:
            ends[(s.device, s.iteration, s.microbatch)] = s.end_s
    for s in r.span_records():
        if s.kind == BACKWARD:
            assert ends[(s.device, s.iteration, s.microbatch)] <= s.start_s + 1e-12
    assert set(r.memory_breakdown_bytes) <= set(MEMORY_KINDS)
    weights = [params * (x[2]) for x in r.extra["stage_layers"]]
    for peak, w in zip(r.per_gpu_peak_memory_bytes, weights):
        assert peak >= 3 * w  # weights, gradients and momentum are always held


# ---- memory model ------------------------------------------------------------------------


def test_pipedream_stashes_older_versions_on_early_stages_and_spectrain_none():
    n, p = 4, 40_000_000
    trace = layers([(0.01, 0.02)] * n, params=p, act=1_000_000)
    pd = run(trace, "pipedream", n, PipeDreamOptions(straight=True, microbatches=8), iterations=3)
    # stage k keeps N-k versions: N-k-1 stashed copies besides the current weights
    assert pd.extra["stash_peak_bytes"] == [(n - k - 1) * p for k in range(n)]
    stale = run(trace, "pipedream", n, PipeDreamOptions(straight=True, stash=False, microbatches=8))
    assert stale.extra["stash_peak_bytes"] == [0] * n
    sp = run(trace, "spectrain", n, iterations=3)
    assert sp.extra["stash_peak_bytes"] == [0] * n
    assert sp.memory_breakdown_bytes["stash"] == 0
    assert sp.memory_breakdown_bytes["buffers"] == p  # the predicted weights
    # weights + gradients + momentum + 3 stashed versions on stage 0
    assert pd.per_gpu_peak_memory_bytes[0] > pd.per_gpu_peak_memory_bytes[n - 1]
    assert pd.per_gpu_peak_memory_bytes[0] - sp.per_gpu_peak_memory_bytes[0] == pytest.approx(
        (n - 1) * p - p, abs=4_000_000
    )


def test_pipedream_keeps_activations_of_its_micro_batches_in_flight():
    n, m, act = 3, 6, 6_000_000
    trace = layers([(0.01, 0.02)] * n, act=act)
    r = run(trace, "pipedream", n, PipeDreamOptions(straight=True, microbatches=m))
    for k in range(n):
        # a micro-batch in flight: the stage's activations, and its input after the first
        per_mb = (2 if k else 1) * act / m
        assert r.per_gpu_peak_memory_bytes[k] == pytest.approx((n - k) * per_mb)
        assert r.extra["activation_peak_bytes"][k] == pytest.approx((n - k) * per_mb, abs=1)


def test_gpipe_recompute_trades_time_for_activation_memory():
    n, m = 2, 4
    trace = layers([(0.01, 0.02)] * (2 * n), act=8_000_000)
    plain = run(trace, "gpipe", n, GPipeOptions(microbatches=m, partition="layers"))
    remat = run(trace, "gpipe", n, GPipeOptions(microbatches=m, partition="layers", recompute=True))
    # two layers of 8 MB per stage: all 4 micro-batches' activations (16 MB) and inputs
    # (8 MB) ...
    assert plain.per_gpu_peak_memory_bytes[1] == 24_000_000
    # ... versus the 4 stage inputs (one layer's output, 2 MB each) plus one micro-batch's
    # activations (4 MB) while it is recomputed
    assert remat.per_gpu_peak_memory_bytes[1] == 4 * 2_000_000 + 4_000_000
    # every slot of the backward half of the pipeline, (M+N-1) of them, grows by one
    # forward of the stage per micro-batch (two layers of 0.01 s over M)
    extra = (m + n - 1) * 2 * 0.01 / m
    assert remat.iteration_time_s == pytest.approx(plain.iteration_time_s + extra, rel=1e-9)
    assert any(s.kind == RECOMPUTE for s in remat.span_records())


@pytest.mark.parametrize(
    "scheme, options, reruns",
    [
        ("spectrain", {}, True),
        ("pipedream", {"scheme.straight": True, "scheme.stash": False}, True),
        ("pipedream", {"scheme.straight": True}, False),  # the stash keeps the forward's
        ("gpipe", {}, False),
    ],
)
def test_a_backward_at_other_weights_reruns_its_forward_on_cpu_hosts(scheme, options, reruns):
    """On CPU hosts (ranks that compute with real torch) a backward at other weights than
    its forward's runs the forward again first, as ``sim real`` must: one re-run per
    backward, each the forward's length on an idle core. On GPUs the scheme's cost
    stands without it."""
    spec = RunSpec(scheme=scheme, gpus=3, model="resnet18-cpu", iterations=2, topology="netns")
    result = simulate(build_config(spec.replace(**options), record_spans=True))
    spans = result.span_records()
    rerun = [s for s in spans if s.kind == RECOMPUTE]
    backward = {(s.device, s.microbatch) for s in spans if s.kind == BACKWARD}
    assert backward
    assert len({(s.device, s.microbatch) for s in rerun}) == (len(backward) if reruns else 0)
    gpu = simulate(build_config(spec.replace(topology="dgx1", **options), record_spans=True))
    assert not any(s.kind == RECOMPUTE for s in gpu.span_records())


# ---- communication, replication, configuration ------------------------------------------


def test_activations_and_gradients_cross_the_links():
    n, m, act = 2, 4, 10_000_000
    trace = layers([(0.01, 0.02)] * 2, act=act)
    r = run(trace, "gpipe", n, GPipeOptions(microbatches=m), iterations=2, warmup_iterations=0)
    # per iteration: each micro-batch's boundary activation forward and its gradient back
    assert r.comm_bytes_total == 2 * 2 * act
    assert r.messages == 2 * 2 * m
    # and it costs time: B = 10 GB/s, 2.5 MB per message, overlapped where the pipeline
    # allows; at least one forward transfer and one backward transfer are exposed
    free = run(layers([(0.01, 0.02)] * 2), "gpipe", n, GPipeOptions(microbatches=m))
    assert r.iteration_time_s >= free.iteration_time_s + 2 * (act / m) / BW - 1e-12


def replicable():
    """A heavy first layer without weights, then two light layers with many."""
    return chain(
        TraceMeta("toy", "V100", 64),
        [
            Layer("l0", 0.04, 0.08, param_bytes=1_000_000),
            Layer("l1", 0.01, 0.02, param_bytes=400_000_000),
            Layer("l2", 0.01, 0.02, param_bytes=400_000_000),
        ],
    )


def test_replicated_stages_all_reduce_their_gradients():
    r = run(replicable(), "pipedream", 4, PipeDreamOptions(microbatches=6), iterations=3)
    assert r.extra["stage_replicas"] == [3, 1]
    ar = [s for s in r.span_records() if s.kind.startswith("allreduce")]
    assert {s.device for s in ar} == set(r.device_names[:3])
    rounds = {(s.start_s, s.iteration) for s in ar if 0 <= s.iteration < 4}
    assert len(rounds) == 2 * 4  # per iteration, one per round of 3
    # The partitioner's bottleneck is the second stage, 6 x 0.01 s per iteration, but a
    # replica waits in each round's all-reduce for the round's last micro-batch, which
    # the second stage finishes two micro-batches later: so the first stage runs at
    # about 0.043 s per round, not 0.03 (as in PipeDream's runtime, where the gradient
    # all-reduce of replicated stages is synchronous).
    assert 0.06 < r.iteration_time_s < 0.09


def test_replication_needs_whole_rounds_of_micro_batches():
    with pytest.raises(ConfigError, match="multiple"):
        run(replicable(), "pipedream", 4, PipeDreamOptions(microbatches=4))
    auto = run(replicable(), "pipedream", 4)
    assert auto.extra["microbatches"] == 6  # one per GPU, rounded up to 3s


def test_configurations_that_cannot_be_pipelined_are_refused():
    with pytest.raises(ConfigError, match="at most 2: model 'toy' has 2 layers"):
        run(layers([(0.01, 0.02)] * 2), "gpipe", 3)
    with pytest.raises(ConfigError, match="at most the batch size"):
        run(layers([(0.01, 0.02)] * 2, batch=4), "gpipe", 2, GPipeOptions(microbatches=8))


def test_spectrain_version_difference_follows_the_reference_code():
    assert [version_difference(k, 4, True) for k in range(4)] == [3, 2, 2, 1]
    assert [version_difference(k, 4, False) for k in range(4)] == [0, 0, 1, 1]


@pytest.mark.parametrize("scheme", ["mp", "gpipe", "pipedream", "spectrain"])
def test_builtin_models_run_on_the_default_topology(scheme):
    r = simulate(
        build_config(
            RunSpec(scheme=scheme, gpus=4, model="alexnet", iterations=2), record_spans=False
        )
    )
    d = r.to_dict()
    assert d["scheme"] == scheme and d["gpus"] == 4
    assert 0 < d["gpu_utilization"] <= 1 and d["throughput_samples_s"] > 0
    assert d["comm_bytes_by_link_kind"]["pcie"] > 0
    assert d["partition"] == "antichain" and sum(d["stage_replicas"]) == 4
    if scheme == "mp":
        assert d["speedup"] < 1.0


def test_partition_option_picks_the_method():
    spec = RunSpec(scheme="gpipe", gpus=4, model="vgg16", iterations=2)
    ant = simulate(build_config(spec, record_spans=False))
    lay = simulate(build_config(spec.replace(**{"scheme.partition": "layers"}), record_spans=False))
    assert lay.extra["partition"] == "layers"
    assert [x[2] for x in lay.extra["stage_layers"]] == [11, 10, 10, 10]
    assert ant.throughput_samples_s > lay.throughput_samples_s
    assert load_builtin("vgg16").meta.batch_size == ant.batch_size


def test_traffic_per_iteration_counts_measured_iterations_only():
    """PipeDream and SpecTrain also simulate a lead-in and a drain; their traffic per
    iteration must equal GPipe's on the same stages and micro-batches."""
    trace = layers([(0.01, 0.02)] * 8, act=1_000_000)
    per_it = {
        scheme: run(trace, scheme, 4, opts).comm_bytes_per_iteration
        for scheme, opts in (
            ("gpipe", GPipeOptions(microbatches=4)),
            ("pipedream", PipeDreamOptions(microbatches=4, straight=True)),
            ("spectrain", None),
        )
    }
    assert per_it["gpipe"] > 0
    assert per_it["pipedream"] == pytest.approx(per_it["gpipe"])
    assert per_it["spectrain"] == pytest.approx(per_it["gpipe"])
