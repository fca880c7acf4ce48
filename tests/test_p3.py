"""p3: slicing and placement, priority on the wire, fused push-pull, and P3 against ps."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtsim.cli import main
from dtsim.resolve import load_preset
from simcore import SimConfig, TopologySpec, simulate
from simcore.config import OPTIMIZERS
from simcore.schemes.p3 import P3Options, p3_slices
from simcore.schemes.ps import PSOptions
from simcore.topology import star_topology
from traces import Layer, TraceMeta, chain, load_builtin


def test_slices_are_cut_to_size_and_dealt_round_robin_over_all_arrays():
    arrays = [(0, 100), (1, 450_000), (2, 200_000), (4, 30)]
    got = [(s.layer, s.server, s.nbytes, s.priority)
           for s in p3_slices(arrays, servers=3, slice_bytes=200_000)]
    assert got == [(0, 0, 100, 0.0),
                   (1, 1, 200_000, 1.0), (1, 2, 200_000, 1.0), (1, 0, 50_000, 1.0),
                   (2, 1, 200_000, 2.0),
                   (4, 2, 30, 4.0)]


def test_per_key_round_robin_restarts_at_server_zero_for_every_array():
    got = [(s.layer, s.server, s.nbytes)
           for s in p3_slices([(0, 100), (1, 450_000), (2, 30)], servers=3, slice_bytes=200_000,
                              round_robin="per-key")]
    assert got == [(0, 0, 100), (1, 0, 200_000), (1, 1, 200_000), (1, 2, 50_000), (2, 0, 30)]


@pytest.mark.parametrize("slice_params", [50_000, 40_000])
def test_vgg16_slice_count_follows_the_slice_size(slice_params):
    vgg = load_builtin("vgg16")
    r = simulate(SimConfig(trace=vgg, topology=TopologySpec(load_preset("ethernet"), gpus=2),
                           scheme="p3", options=P3Options(slice_params=slice_params),
                           iterations=1, warmup_iterations=0, fidelity="analytic",
                           record_spans=False))
    size = slice_params * 4
    assert r.extra["slice_bytes"] == size
    assert r.extra["shards"] == sum(-(-layer.param_bytes // size) for layer in vgg.layers)
    assert r.extra["servers"] == 2


def test_fused_push_pull_of_one_slice_closed_form():
    """p workers and one dedicated server on a star of equal links, one layer of n bytes
    in one slice: the pushes serialise on the server's link ((p+1)·n/B + 2α), the server
    adds the last push (n/R) and updates (5·n/R for momentum), and the fused answers go
    back the same way ((p+1)·n/B + 2α); no acknowledgement or pull request."""
    n, bw, lat, rate = 1_000_000, 1e9, 1e-5, 1e9
    trace = chain(TraceMeta("one", "V100", 1), [Layer("l0", 0.01, 0.02, param_bytes=n)])
    for p in (1, 2, 3):
        opts = P3Options(placement="dedicated", servers=1, server_bandwidth=rate,
                         slice_params=n // 4)
        r = simulate(SimConfig(trace=trace, topology=star_topology(p, bw, lat, servers=1),
                               scheme="p3", options=opts, iterations=1, warmup_iterations=0,
                               chunk_bytes=n))
        passes = OPTIMIZERS["momentum"][1]
        expected = 0.03 + 2 * (p + 1) * n / bw + 4 * lat + (1 + passes) * n / rate
        assert r.iteration_times_s[0] == pytest.approx(expected, rel=1e-12)
        assert r.messages == 2 * p


def priority_story(scheme: str):
    """One worker and a dedicated server behind a slow link: backward produces the last
    layer's 20 slices first, then (while they queue) the first layer's 2 slices."""
    layers = [Layer("first", 0.001, 0.001, param_bytes=400_000),
              Layer("last", 0.001, 0.001, param_bytes=4_000_000)]
    trace = chain(TraceMeta("two", "V100", 1), layers)
    options = (P3Options(placement="dedicated", servers=1) if scheme == "p3"
               else PSOptions(placement="dedicated", servers=1))
    r = simulate(SimConfig(trace=trace, topology=star_topology(1, 1e8, 1e-5, servers=1),
                           scheme=scheme, options=options, iterations=1, warmup_iterations=0))
    return [s for s in r.span_records() if s.stream == "recv"]


def test_under_contention_the_first_layers_slices_arrive_first():
    recv = priority_story("p3")
    pushes = [s for s in recv if s.name.startswith("push")]
    values = [s for s in recv if s.name.startswith("pull")]
    assert len(pushes) == len(values) == 22
    # The first layer's gradient exists 1 ms after the last layer's 20 slices start
    # queueing, yet only the slice already on the wire gets ahead of it, both on the way
    # to the server and on the way back.
    for spans, tag in ((pushes, "push"), (values, "pull")):
        first_done = max(s.end_s for s in spans if s.name == f"{tag} L0")
        assert sum(s.end_s < first_done for s in spans if s.name == f"{tag} L1") == 1
    # A FIFO parameter server (ps) delivers the last layer first.
    fifo = priority_story("ps")
    assert max(s.end_s for s in fifo if s.name == "push L1") < min(
        s.end_s for s in fifo if s.name == "push L0")


@st.composite
def paper_setups(draw):
    """P3's setting: one GPU per host, a co-located server on every host, hosts on one
    switch at 1-30 Gbps, any model shape."""
    layers = [Layer(f"l{i}", draw(st.floats(1e-4, 2e-2)), draw(st.floats(1e-4, 4e-2)),
                    param_bytes=draw(st.integers(0, 8_000_000)), activation_bytes=1000)
              for i in range(draw(st.integers(1, 6)))]
    topo = TopologySpec(load_preset("ethernet"), gpus=draw(st.integers(1, 6)),
                        bandwidth_bytes_per_s=draw(st.floats(1e9 / 8, 30e9 / 8)))
    ps = SimConfig(trace=chain(TraceMeta("prop", "V100", 4), layers), topology=topo,
                   scheme="ps", iterations=2, warmup_iterations=1, record_spans=False,
                   fidelity=draw(st.sampled_from(["detailed", "analytic"])))
    return ps, replace(ps, scheme="p3", options=P3Options())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paper_setups())
def test_p3_is_never_slower_than_ps_in_the_papers_setting(setup):
    """P3 is never slower than the ps baseline where the paper claims it: one worker per
    host with a co-located server per host on one switch (the ``ethernet`` preset).

    Outside that domain the model has small counterexamples, found by Hypothesis and kept
    as a documented effect, not a bug: several workers sharing one server (a PCIe box, or
    one dedicated server) with a single-slice-plus-a-byte layer. ps answers each worker
    with one whole message, so the workers finish one after the other and their next
    pushes do not collide; P3 interleaves every worker's slices, so they finish together
    and their next pushes contend (0.02% slower in the detailed model, one slice time in
    the analytic one). See docs/p3_gossip.md."""
    ps, p3 = setup
    assert simulate(p3).iteration_time_s <= simulate(ps).iteration_time_s * (1 + 1e-9)


def test_cli_p3_is_ahead_of_ps_on_vgg16_at_10gbps(capsys):
    args = ["run", "--gpus", "4", "--topology", "ethernet", "--bandwidth", "10Gbps",
            "--model", "vgg16", "--iterations", "2", "--json"]
    out = {}
    for scheme in ("ps", "p3"):
        with pytest.raises(SystemExit) as ex:
            main([*args, "--scheme", scheme])
        assert ex.value.code == 0
        out[scheme] = json.loads(capsys.readouterr().out)
    assert out["p3"]["throughput_samples_s"] > 1.2 * out["ps"]["throughput_samples_s"]
    assert out["p3"]["comm_bytes_per_iteration"] == pytest.approx(
        out["ps"]["comm_bytes_per_iteration"], rel=0.01)


@pytest.mark.parametrize("setting, needle", [
    ("scheme.round_robin=random", "choose one of: global, per-key"),
    ("scheme.slice_params=0", "must be at least 1"),
])
def test_bad_p3_options_are_one_line_errors(capsys, setting, needle):
    with pytest.raises(SystemExit) as ex:
        main(["run", "--scheme", "p3", "--set", setting])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1
