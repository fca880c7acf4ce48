"""p3: slicing and placement, priority on the wire, fused push-pull, and P3 against ps."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtsim.cli import main
from dtsim.resolve import build_config, load_preset
from dtsim.spec import RunSpec
from simcore import SimConfig, TopologySpec, simulate
from simcore.config import OPTIMIZERS
from simcore.schemes.p3 import P3Options, p3_slices
from simcore.schemes.ps import PSOptions
from tests.helpers import star_topology
from traces import Layer, TraceMeta, chain, load_builtin


def test_slices_are_cut_to_size_and_dealt_round_robin_over_all_arrays():
    arrays = [(0, 100), (1, 450_000), (2, 200_000), (4, 30)]
    got = [
        (s.layer, s.server, s.nbytes, s.priority)
        for s in p3_slices(arrays, servers=3, slice_bytes=200_000)
    ]
    assert got == [
        (0, 0, 100, 0.0),
        (1, 1, 200_000, 1.0),
        (1, 2, 200_000, 1.0),
        (1, 0, 50_000, 1.0),
        (2, 1, 200_000, 2.0),
        (4, 2, 30, 4.0),
    ]


def test_per_key_round_robin_restarts_at_server_zero_for_every_array():
    got = [
        (s.layer, s.server, s.nbytes)
        for s in p3_slices(
            [(0, 100), (1, 450_000), (2, 30)], servers=3, slice_bytes=200_000, round_robin="per-key"
        )
    ]
    assert got == [(0, 0, 100), (1, 0, 200_000), (1, 1, 200_000), (1, 2, 50_000), (2, 0, 30)]


@pytest.mark.parametrize("slice_params", [50_000, 40_000])
def test_vgg16_slice_count_follows_the_slice_size(slice_params):
    vgg = load_builtin("vgg16")
    r = simulate(
        SimConfig(
            trace=vgg,
            topology=TopologySpec(load_preset("ethernet"), gpus=2),
            scheme="p3",
            options=P3Options(slice_params=slice_params),
            iterations=1,
            warmup_iterations=0,
            fidelity="analytic",
            record_spans=False,
        )
    )
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
        opts = P3Options(
            placement="dedicated", servers=1, server_bandwidth=rate, slice_params=n // 4
        )
        r = simulate(
            SimConfig(
                trace=trace,
                topology=star_topology(p, bw, lat, servers=1),
                scheme="p3",
                options=opts,
                iterations=1,
                warmup_iterations=0,
                chunk_bytes=n,
            )
        )
        passes = OPTIMIZERS["momentum"][1]
        expected = 0.03 + 2 * (p + 1) * n / bw + 4 * lat + (1 + passes) * n / rate
        assert r.iteration_times_s[0] == pytest.approx(expected, rel=1e-12)
        assert r.messages == 2 * p


def priority_story(scheme: str):
    """One worker and a dedicated server behind a slow link: backward produces the last
    layer's 20 slices first, then (while they queue) the first layer's 2 slices."""
    layers = [
        Layer("first", 0.001, 0.001, param_bytes=400_000),
        Layer("last", 0.001, 0.001, param_bytes=4_000_000),
    ]
    trace = chain(TraceMeta("two", "V100", 1), layers)
    options = (
        P3Options(placement="dedicated", servers=1)
        if scheme == "p3"
        else PSOptions(placement="dedicated", servers=1)
    )
    r = simulate(
        SimConfig(
            trace=trace,
            topology=star_topology(1, 1e8, 1e-5, servers=1),
            scheme=scheme,
            options=options,
            iterations=1,
            warmup_iterations=0,
        )
    )
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
        s.end_s for s in fifo if s.name == "push L0"
    )


PAPER_MODELS = ("resnet50", "inception_v3", "vgg16", "gnmt")
"""Built-in profiles of the models the P3 paper trains (VGG-16 for its VGG-19, GNMT for
Sockeye)."""


@st.composite
def paper_setups(draw):
    """P3's testbed: 4 one-GPU hosts on one switch at 1-30 Gbps, a co-located server on
    every host (the ``ethernet`` preset), one of the paper's models at its profiled or a
    smaller batch. Four measured iterations (P3 can alternate between a short and a long
    iteration when communication dominates; an even count averages the pair)."""
    spec = RunSpec(
        gpus=4,
        topology="ethernet",
        model=draw(st.sampled_from(PAPER_MODELS)),
        bandwidth=f"{draw(st.floats(1.0, 30.0)):.4f}Gbps",
        batch_size=draw(st.sampled_from([0, 16, 32, 64])),
        iterations=4,
    )
    return (
        build_config(spec.replace(scheme="ps"), record_spans=False),
        build_config(spec.replace(scheme="p3"), record_spans=False),
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(paper_setups())
def test_p3_is_never_slower_than_ps_in_the_papers_setting(setup):
    """P3 is never slower than the ps baseline in the setting the paper claims it for:
    its models on its 4-machine testbed (one GPU each, a co-located server each) at
    1-30 Gbps. 150 random such configurations were checked while writing this test,
    none slower.

    Outside that domain the property fails, for understood reasons (docs/p3_gossip.md):

    * synthetic traces with one array of a slice and a few bytes (the next test): ps
      answers each worker with one whole message, the workers drift apart and their
      pushes stop colliding; P3 finishes them together (P3 up to 0.5% slower);
    * more hosts while communication dominates, e.g. ResNet-50 at batch 16 on 7 hosts at
      1.5 Gbps: P3 1.27 s against ps 1.07 s per iteration. Each slice is answered only
      when all 7 workers' pushes are in, so the pipeline of 200 KB slices fills and
      drains slowly; 10,000-parameter slices bring P3 to 0.91 s, the link bound;
    * a GPU that computes 0.2% of the time (AlexNet, batch 32, 5 hosts, 1.2 Gbps): both
      schemes only move bytes, P3 by 0.07% more slowly.
    """
    ps, p3 = setup
    assert simulate(p3).iteration_time_s <= simulate(ps).iteration_time_s * (1 + 1e-9)


def test_p3_can_trail_ps_when_ps_staggers_the_workers():
    """The counterexample Hypothesis found on synthetic traces: two hosts at 1 Gbps, one
    array of 234,698 bytes (a slice and 34,698 bytes) and one of a single byte."""
    layers = [
        Layer("l0", 0.015625, 0.00390625, param_bytes=1),
        Layer("l1", 0.015625, 0.03125, param_bytes=234_698),
        Layer("l2", 0.015625, 0.03125),
        Layer("l3", 0.015625, 0.03125),
    ]
    ps = SimConfig(
        trace=chain(TraceMeta("ce", "V100", 4), layers),
        iterations=2,
        topology=TopologySpec(load_preset("ethernet"), 2, 1.25e8),
        chunk_bytes=256 * 1024,
        scheme="ps",
    )
    p3 = replace(ps, scheme="p3", options=P3Options())
    rps, rp3 = simulate(ps), simulate(p3)
    assert rps.iteration_time_s < rp3.iteration_time_s < 1.006 * rps.iteration_time_s

    def gap(r, it):
        a, b = sorted(
            s.start_s
            for s in r.span_records()
            if s.kind == "forward" and s.name == "l0" and s.iteration == it
        )
        return b - a

    assert gap(rps, 1) > 0.003  # ps: one worker runs ahead by ms
    assert gap(rp3, 1) < 1e-5 and gap(rp3, 2) < 1e-5  # P3: the workers start together


def test_cli_p3_is_ahead_of_ps_on_vgg16_at_10gbps(capsys):
    args = [
        "run",
        "--gpus",
        "4",
        "--topology",
        "ethernet",
        "--bandwidth",
        "10Gbps",
        "--model",
        "vgg16",
        "--iterations",
        "2",
        "--json",
    ]
    out = {}
    for scheme in ("ps", "p3"):
        with pytest.raises(SystemExit) as ex:
            main([*args, "--scheme", scheme])
        assert ex.value.code == 0
        out[scheme] = json.loads(capsys.readouterr().out)
    assert out["p3"]["throughput_samples_s"] > 1.2 * out["ps"]["throughput_samples_s"]
    assert out["p3"]["comm_bytes_per_iteration"] == pytest.approx(
        out["ps"]["comm_bytes_per_iteration"], rel=0.01
    )


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("scheme.round_robin=random", "choose one of: global, per-key"),
        ("scheme.slice_params=0", "must be at least 1"),
    ],
)
def test_bad_p3_options_are_one_line_errors(capsys, setting, needle):
    with pytest.raises(SystemExit) as ex:
        main(["run", "--scheme", "p3", "--set", setting])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_on_seven_hosts_p3_trails_ps_until_its_slices_shrink():
    """Out of the paper's domain (see the property above): ResNet-50 at batch 16 on 7
    hosts at 1.5 Gbps, where communication dominates. With 50,000-parameter slices P3
    trails ps; with 10,000 it leads again and comes close to the link bound (each NIC
    sends 2 x 6/7 of the model per iteration)."""
    spec = RunSpec(
        gpus=7,
        topology="ethernet",
        model="resnet50",
        bandwidth="1.546Gbps",
        batch_size=16,
        iterations=4,
    )

    def iteration_s(scheme, **options):
        spec2 = spec.replace(scheme=scheme, **{f"scheme.{k}": v for k, v in options.items()})
        return simulate(build_config(spec2, record_spans=False)).iteration_time_s

    ps = iteration_s("ps")
    bound = 2 * 6 / 7 * load_builtin("resnet50").param_bytes / (1.546e9 / 8)
    assert iteration_s("p3") > 1.1 * ps
    assert bound < iteration_s("p3", slice_params=10_000) < min(ps, 1.05 * bound)
