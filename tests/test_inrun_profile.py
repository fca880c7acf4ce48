"""Traces measured inside a real run (realrun.metrics.trace_from_run): golden tiny records,
then a real one-rank run whose trace adds up to its passes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from realrun.metrics import (
    UpdateCost,
    isend_overhead_s,
    posted_cpu_s_per_end,
    predict_overhead_s,
    server_step_overhead_s,
    trace_from_run,
    update_cost,
)
from traces.model import Layer, TraceMeta, chain


def base() -> object:
    layers = [Layer("a", 1.0, 1.0, param_bytes=400), Layer("b", 1.0, 1.0, param_bytes=400)]
    return chain(TraceMeta("m", "cpu", 8), layers)


def span(kind, name, a, b, it, mb=0, stream="compute"):
    return ["r0", stream, kind, name, a, b, it, -1, mb, 0, -1]


def records(spans, microbatches=2):
    job = {
        "scheme": "gpipe",
        "warmup_iterations": 1,
        "batch_size": 8,
        "pipeline": {"microbatches": microbatches},
    }
    return {"job": job, "ranks": [{"role": "worker", "spans": spans}]}


def test_each_layer_is_charged_from_the_previous_span_end():
    spans = [
        span("forward", "a", 0.0, 5.0, 0),  # warm-up: ignored
        span("forward", "a", 10.0, 10.1, 1),  # first measured span: from its own start
        span("forward", "b", 10.15, 10.3, 1),  # 0.05 s gap charged to b
        span("wait", "wait grad", 10.3, 10.9, 1),
        span("backward", "b", 11.0, 11.2, 1),  # from the wait's end: 0.3
        span("backward", "a", 11.3, 11.4, 1),  # 0.2
        span("update", "optimizer step", 11.4, 11.5, 1),
    ]
    tr = trace_from_run(records(spans), base())
    a, b = tr.layers
    assert (a.forward_s, b.forward_s) == pytest.approx((0.1, 0.2))
    assert (a.backward_s, b.backward_s) == pytest.approx((0.2, 0.3))
    assert tr.meta.batch_size == 4  # the micro-batch
    assert a.param_bytes == 400
    assert "measured inside a gpipe run" in tr.meta.provenance
    assert update_cost(records(spans), base(), 5) == UpdateCost(pytest.approx(5 * 800 / 0.1))


def test_a_pipelines_sends_are_the_threads_hold_not_the_next_layers():
    """A stage's main thread hands each message to gloo (a send span): that time, from
    the span before it, is the sends' (``isend_overhead_s``: their mean less the CPU the
    simulator charges a message's sending end), not the next layer's; a send from inside
    a span stays the span's; a scheme that sends from other threads (dp) keeps it all
    in the layers."""

    def send(a, b, nbytes=1000):
        return ["r0", "send", "send", "act mb0.0", a, b, 1, -1, 0, nbytes, 7]

    spans = [
        span("forward", "a", 10.0, 10.1, 1),
        send(10.12, 10.2),  # charged from a's end: 0.1
        span("forward", "b", 10.25, 10.3, 1),  # from the send's end: 0.1
        send(10.3, 10.35),  # 0.05
        span("wait", "wait grad", 10.35, 10.9, 1),
        span("backward", "b", 11.0, 11.2, 1),
        send(11.1, 11.15),  # from inside b's span (a hook, as gossip's): b's
        span("backward", "a", 11.3, 11.4, 1),
    ]
    tr = trace_from_run(records(spans), base())
    assert [x.forward_s for x in tr.layers] == pytest.approx([0.1, 0.1])
    assert [x.backward_s for x in tr.layers] == pytest.approx([0.2, 0.3])
    assert isend_overhead_s(records(spans), base(), 0.01, 1e-5) == pytest.approx(0.055)
    assert isend_overhead_s(records(spans), base(), 0.2, 0.0) == 0.0  # never negative
    dp = records(spans)
    dp["job"]["scheme"] = "dp"
    assert [x.forward_s for x in trace_from_run(dp, base()).layers] == pytest.approx([0.1, 0.2])
    assert isend_overhead_s(dp, base(), 0.01, 1e-5) is None
    assert isend_overhead_s(records(spans[:1]), base(), 0.01, 1e-5) is None  # no sends


def test_a_pipelines_transport_threads_cpu_is_its_processes_beyond_main_threads():
    """``posted_cpu_s_per_end``: over the measured iterations (1 and 2 after one of
    warm-up), the workers' process clocks less their main threads' (0.5 + 0.3 s), less
    what the simulator charges each received message (0.01 s + 1e-5 s a byte), over
    every message end (two sends, three receives): (0.8 - 3 x 0.02) / 5."""

    def msg(stream, it, nbytes=1000):
        return ["r0", stream, stream, "act mb0.0", 1.0 * it, 1.0 * it + 0.1, it, -1, 0, nbytes, 7]

    def rank(proc, main, spans):
        return {"role": "worker", "spans": spans,
                "cpu_at_end": {"0": 1.0, "2": 1.0 + proc},
                "main_cpu_at_end": {"0": 0.5, "2": 0.5 + main}}  # fmt: skip

    run = records([])
    run["job"]["iterations"] = 2
    sent = [msg("send", 0), msg("send", 1), msg("send", 2), msg("send", 3)]  # 0, 3: outside
    got = [msg("recv", 1), msg("recv", 1), msg("recv", 2), msg("recv", 3)]
    run["ranks"] = [rank(1.5, 1.0, sent), rank(2.0, 1.7, got)]
    expected = (0.8 - 3 * (0.01 + 1e-5 * 1000)) / 5
    assert posted_cpu_s_per_end(run, 0.01, 1e-5) == pytest.approx(expected)
    assert posted_cpu_s_per_end(run, 1.0, 0.0) == 0.0  # never negative
    dp = dict(run, job=dict(run["job"], scheme="dp"))
    assert posted_cpu_s_per_end(dp, 0.01, 1e-5) is None  # not a pipeline
    old = dict(run, ranks=[dict(r, main_cpu_at_end={}) for r in run["ranks"]])
    assert posted_cpu_s_per_end(old, 0.01, 1e-5) is None  # recorded before the clocks
    quiet = dict(run, ranks=[dict(r, spans=[]) for r in run["ranks"]])
    assert posted_cpu_s_per_end(quiet, 0.01, 1e-5) is None  # no messages


def test_a_rank_that_waited_for_a_core_is_charged_its_cpu_time():
    """Spans of 0.1 + 0.2 + 0.1 s of wall time in which the main thread's CPU clock
    advanced 0.2 s: every charged time is halved, the layers' and the update's."""
    spans = [
        span("forward", "a", 10.0, 10.1, 1),
        span("wait", "wait", 10.1, 10.5, 1),
        span("backward", "a", 10.5, 10.7, 1),
        span("update", "optimizer step", 10.7, 10.8, 1),
    ]
    rec = records(spans)
    rec["ranks"][0]["main_cpu_at_end"] = {"0": 3.0, "1": 3.2}
    a, _b = trace_from_run(rec, base()).layers
    assert (a.forward_s, a.backward_s) == pytest.approx((0.05, 0.1))
    assert update_cost(rec, base(), 5).bytes_per_s == pytest.approx(5 * 800 / 0.05)
    # CPU beyond the spans (messages posted and waited for) is not compute: unscaled
    rec["ranks"][0]["main_cpu_at_end"] = {"0": 3.0, "1": 3.8}
    a, _b = trace_from_run(rec, base()).layers
    assert (a.forward_s, a.backward_s) == pytest.approx((0.1, 0.2))


def test_a_step_taken_layer_by_layer_adds_up_per_iteration():
    """Gossip steps each layer on its own: two update spans of 0.05 s an iteration, one
    per layer, are a step of 0.1 s over both layers' 800 bytes, not 0.05 s."""
    spans = []
    for it in (1, 2):
        t = 10.0 * it
        spans += [
            span("forward", "a", t, t + 0.1, it),
            layer_span("update", "update L0", t + 0.1, t + 0.15, it, 0),
            layer_span("update", "update L1", t + 0.15, t + 0.2, it, 1),
        ]
    assert update_cost(records(spans), base(), 1) == UpdateCost(pytest.approx(800 / 0.1))
    # a pipeline stage's steps name no layer: two an iteration are two steps of 0.05 s
    for s in spans:
        s[7] = -1
    assert update_cost(records(spans), base(), 1) == UpdateCost(pytest.approx(800 / 0.05))


def with_unrecorded(forward_s, backward_s):
    """Input ``x``, layers ``a`` and ``b`` with parameters and ``r`` between them
    without, whose isolated times are ``forward_s`` and ``backward_s``."""
    layers = [
        Layer("x", 0.0, 0.0, kind="input"),
        Layer("a", 1.0, 1.0, param_bytes=400),
        Layer("r", forward_s, backward_s),
        Layer("b", 1.0, 1.0, param_bytes=400),
    ]
    return chain(TraceMeta("m", "cpu", 8), layers)


def assert_arb(x, a, r, b, forward, backward):
    """``a``, ``r``, ``b``'s forward times are ``forward``, ``b``, ``r``, ``a``'s backward
    times (backward order) ``backward``, and the input ``x`` has none."""
    assert (a.forward_s, r.forward_s, b.forward_s) == pytest.approx(forward)
    assert (b.backward_s, r.backward_s, a.backward_s) == pytest.approx(backward)
    assert (x.forward_s, x.backward_s) == (0.0, 0.0)


def test_layers_a_wait_follows_get_the_time_before_it():
    """A gossip worker waits for its partner's gradients before each layer with
    parameters: the layer without them between two such layers (``r``, unrecorded) runs
    between the recorded span before it and the wait, so that time is its own (forward:
    after ``a``; backward: after ``b``), not nothing; a gap before a wait with no
    unrecorded layer there (after the last backward) is charged to no layer."""
    three = with_unrecorded(0.0, 0.0)
    spans = [
        span("forward", "a", 10.0, 10.1, 1),
        span("wait", "wait L3", 10.3, 10.5, 1),  # 0.2 s of r's forward before it
        layer_span("update", "update L3", 10.5, 10.55, 1, 3),
        span("forward", "b", 10.55, 10.6, 1),
        span("backward", "b", 10.6, 10.7, 1),
        span("wait", "wait", 10.8, 10.9, 1),  # 0.1 s of r's backward
        span("backward", "a", 10.9, 11.0, 1),
        span("wait", "end of backward", 11.4, 11.5, 1),  # nothing below a: no layer's
        # a pass with no wait before b: r's time is in b's span, and r's mean is over
        # both passes (0.2 s in one, none in the other): nothing is counted twice
        span("wait", "wait batch", 19.0, 20.0, 2),
        span("forward", "a", 20.0, 20.1, 2),
        span("forward", "b", 20.4, 20.5, 2),
    ]
    x, a, r, b = trace_from_run(records(spans, microbatches=1), three).layers
    assert_arb(x, a, r, b, forward=(0.1, 0.1, 0.225), backward=(0.1, 0.1, 0.1))
    # the update is charged from the wait's end as before: the gap is not the step's
    assert update_cost(records(spans), three, 1) == UpdateCost(pytest.approx(800 / 0.05))
    assert sum(x.forward_s for x in (a, r, b)) == pytest.approx((0.35 + 0.5) / 2)


def test_layers_the_run_does_not_time_get_their_share_of_the_span_that_holds_them():
    """A data-parallel run times only layers with parameters: the forward span of ``b``
    also holds the forward of ``r`` (no parameters) that ran after ``a``, and the
    backward span of ``a`` holds ``r``'s backward, which ran before it. Each is split by
    the layers' times alone (forward 3:1 for ``r``:``b``, backward 1:1 for ``r``:``a``),
    so a stage cut between ``r`` and ``b`` gives each stage its own layers' time; what
    a pass adds up to is unchanged."""
    three = with_unrecorded(3.0, 1.0)
    spans = [
        span("forward", "a", 10.0, 10.1, 1),
        span("forward", "b", 10.1, 10.5, 1),
        span("backward", "b", 10.5, 10.6, 1),
        span("backward", "a", 10.6, 10.8, 1),
    ]
    x, a, r, b = trace_from_run(records(spans, microbatches=1), three).layers
    assert_arb(x, a, r, b, forward=(0.1, 0.3, 0.1), backward=(0.1, 0.1, 0.1))
    # a layer without a time of its own alone keeps nothing: the span stays its layer's
    _x, a, r, b = trace_from_run(records(spans, microbatches=1), with_unrecorded(0, 0)).layers
    assert (r.forward_s, b.forward_s, a.backward_s) == pytest.approx((0.0, 0.4, 0.2))


def layer_span(kind, name, a, b, it, layer):
    return ["r0", "compute", kind, name, a, b, it, layer, 0, 0, -1]


def stage_updates(stage_layers, seconds):
    rec = records([])
    rec["job"]["pipeline"]["stage_layers"] = stage_layers
    rec["ranks"] = [
        {"role": "worker", "stage": k, "spans": [span("update", "u", 1.0, 1.0 + t, 1)]}
        for k, t in enumerate(seconds)
    ]
    return rec


def test_a_pipelines_update_rate_counts_each_stages_own_layers():
    """Stage 0 updates layer a (400 B) in 0.1 s, stage 1 layer b (400 B) in 0.3 s: 800 B
    in 0.4 s, not the whole model's bytes over one stage's time (one size: no line)."""
    rec = stage_updates([[0], [1]], (0.1, 0.3))
    assert update_cost(rec, base(), 1) == UpdateCost(pytest.approx(800 / 0.4), 0.0)


def test_stages_of_different_sizes_give_the_steps_overhead():
    """Stages of 0, 400 and 800 bytes updating in 0.5, 0.7 and 0.9 ms: a step costs
    0.5 ms whatever its bytes, plus 400 B per 0.2 ms (the least-squares line)."""
    rec = stage_updates([[], [0], [0, 1]], (0.5e-3, 0.7e-3, 0.9e-3))
    cost = update_cost(rec, base(), 1)
    assert cost.overhead_s == pytest.approx(0.5e-3)
    assert cost.bytes_per_s == pytest.approx(400 / 0.2e-3)
    # a line that falls, or would need a negative overhead: the plain ratio, no overhead
    for layout, seconds in (
        ([[], [0], [0, 1]], (0.9e-3, 0.7e-3, 0.5e-3)),
        ([[0], [0, 1]], (0.1e-3, 0.9e-3)),
    ):
        nbytes = sum(400 * len(layers) for layers in layout)
        cost = update_cost(stage_updates(layout, seconds), base(), 1)
        assert cost == UpdateCost(pytest.approx(nbytes / sum(seconds)), 0.0)


def test_spectrains_predictions_give_their_fixed_cost_beyond_the_passes():
    """Stage 0 (layer a, 400 B) predicts twice an iteration in 0.3 and 0.5 ms, stage 1
    (layer b, 400 B) once in 0.6 ms; at 4e6 B/s three passes of 400 B take 0.3 ms: the
    stages' means 0.4 and 0.6 ms less 0.3 ms average 0.2 ms, so the simulated stages'
    predictions add up to the measured ones."""
    rec = stage_updates([[0], [1]], (0.1, 0.1))
    # each span is charged from the end of the one before it (the update's, at 1.1 s)
    rec["ranks"][0]["spans"] += [
        span("predict", "predict stage0", 1.1, 1.1003, 1),
        span("predict", "predict stage0", 1.1003, 1.1008, 1),
    ]
    rec["ranks"][1]["spans"] += [span("predict", "predict stage1", 1.1, 1.1006, 1)]
    assert predict_overhead_s(rec, base(), 3, 4e6) == pytest.approx(0.2e-3)
    # passes that take longer than the predictions did: no negative overhead
    assert predict_overhead_s(rec, base(), 3, 1e6) == 0.0
    with pytest.raises(ValueError, match="no predict spans"):
        predict_overhead_s(stage_updates([[0], [1]], (0.1, 0.1)), base(), 3, 4e6)


def test_unknown_layers_and_empty_runs_are_refused():
    with pytest.raises(ValueError, match="layer 'zz'"):
        trace_from_run(records([span("forward", "zz", 1, 2, 1)]), base())
    with pytest.raises(ValueError, match="no forward or backward spans"):
        trace_from_run(records([span("forward", "a", 1, 2, 0)]), base())
    with pytest.raises(ValueError, match="no update spans"):
        update_cost(records([span("forward", "a", 1, 2, 1)]), base(), 5)


def test_a_real_one_rank_run_gives_a_trace_that_adds_up(tmp_path: Path) -> None:
    """The in-run trace of a real dp run of one rank: its layers' forward and backward
    times add up to the measured passes (within the time outside them: data, loss)."""
    pytest.importorskip("torch")
    from tests.test_real import run
    from traces import jsonfmt

    recs, result, _job = run(tmp_path, scheme="dp", workers=1, iterations=10, profile=True)
    prof = recs.get("profile")
    assert prof is not None
    tr = trace_from_run(recs, jsonfmt.from_dict(prof))
    total = sum(layer.forward_s + layer.backward_s for layer in tr.layers)
    # (the spans are charged from the first measured pass's own start and the period from
    # the warm-up's last end: on a busy machine the two windows differ by a few percent)
    assert 0.3 * result["iteration_time_s"] < total <= 1.1 * result["iteration_time_s"]


def test_repeated_profiles_give_each_layers_median():
    """Three runs' traces: each layer's times are the median run's (an outlier run does
    not move them), the rest is the first trace's; different layers are refused."""
    from dataclasses import replace

    from realrun.metrics import median_trace

    def times(fa, ba, fb, bb):
        a, b = base().layers
        return replace(
            base(),
            layers=(
                replace(a, forward_s=fa, backward_s=ba),
                replace(b, forward_s=fb, backward_s=bb),
            ),
        )

    runs = [times(1.0, 2.0, 3.0, 4.0), times(1.2, 1.8, 9.0, 4.4), times(0.9, 2.2, 3.1, 40.0)]
    a, b = median_trace(runs).layers
    assert (a.forward_s, a.backward_s, b.forward_s, b.backward_s) == (1.0, 2.0, 3.1, 4.4)
    assert a.param_bytes == 400 and "median of 3 runs" in median_trace(runs).meta.provenance
    assert median_trace(runs[:1]) is runs[0]
    other = chain(TraceMeta("m", "cpu", 8), [Layer("z", 1.0, 1.0)])
    with pytest.raises(ValueError, match="different layers"):
        median_trace([runs[0], other])
    with pytest.raises(ValueError, match="no traces"):
        median_trace([])


def test_a_data_parallel_runs_wait_for_its_last_buckets_is_no_layers_compute(
    tmp_path: Path,
) -> None:
    """In a real two-rank dp run, what ``backward()`` does after the last layer's
    gradients (DDP waiting for the last buckets' all-reduce) is recorded as a wait, so
    the in-run profile charges the optimizer step only its own span, not that wait."""
    pytest.importorskip("torch")
    from realrun.metrics import _charged_spans
    from tests.test_real import run

    recs, _result, job = run(tmp_path, scheme="dp", workers=2, iterations=4, profile=True)
    warm = job.warmup_iterations
    for rank in recs["ranks"]:
        stream = [s for s in rank["spans"] if s[1] == "compute" and s[6] >= warm]
        waits = [s for s in stream if s[2] == "wait" and s[3] == "end of backward"]
        assert {s[6] for s in waits} == set(range(warm, warm + job.iterations)), rank["rank"]
        # each step's end less the end of the span before it (the wait): all a step may
        # be charged; charging the wait too would add the wait's length to it
        stream.sort(key=lambda s: s[4])
        allowed = [
            (s[5] - before[5], before[5] - before[4])
            for before, s in itertools.pairwise(stream)
            if s[2] == "update"
        ]
        assert all(b[2] == "wait" for b, s in itertools.pairwise(stream) if s[2] == "update")
        charged = [c for kind, *_x, c in _charged_spans(rank, warm) if kind == "update"]
        assert len(charged) == len(allowed) == job.iterations
        for c, (from_wait_end, _wait_s) in zip(charged, allowed, strict=True):
            assert 0 < c <= from_wait_end + 1e-9
        assert any(wait_s > 0 for _end, wait_s in allowed)  # there was a wait to leave out


def test_a_servers_handling_gives_its_fixed_cost_per_shard_update():
    """Two workers, two servers: server 0 (rank 2) keeps shards of 400 and 600 B, server
    1 (rank 3) one of 1000 B; over 3 iterations their handlers took 0.09 and 0.03 s of
    CPU. 9 shard updates, 6000 B of shards: with 2 passes at 1e6 B/s (0.012 s) the fixed
    cost is (0.12 - 0.012) / 9; without servers (or records made before the handlers
    were clocked) there is none to give."""
    placement = [[1, 0, 400], [2, 0, 600], [3, 1, 1000]]
    job = {"warmup_iterations": 1, "iterations": 2, "workers": 2}

    def rank(r, role, handling):
        m = {"handling_cpu_s": handling} if handling is not None else {}
        return {"rank": r, "role": role, "placement": placement, "messenger": m}

    servers = [rank(2, "server", 0.09), rank(3, "server", 0.03)]
    rec = {"job": job, "ranks": [rank(0, "worker", 0.0), rank(1, "worker", 0.0), *servers]}
    assert server_step_overhead_s(rec, 2, 1e6) == pytest.approx((0.12 - 0.012) / 9)
    assert server_step_overhead_s(rec, 2, 1.0) == 0.0  # never below zero
    assert server_step_overhead_s({"job": job, "ranks": rec["ranks"][:2]}, 2, 1e6) is None
    old = [rank(2, "server", None), rank(3, "server", None)]
    assert server_step_overhead_s({"job": job, "ranks": old}, 2, 1e6) is None
