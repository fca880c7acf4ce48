"""dp and ps: closed forms on tiny cases, the 8-GPU ResNet-50 sanity range, memory."""

import pytest

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import SimConfig, simulate
from simcore.config import OPTIMIZERS, ConfigError
from simcore.schemes import get_scheme, registry
from simcore.schemes.dp import DPOptions, ddp_buckets
from simcore.schemes.ps import PSOptions, mxnet_shards
from tests.conftest import synthetic_trace
from tests.helpers import closed_form_ring_allreduce, ring_topology, star_topology
from traces import Layer, TraceMeta, chain, load_builtin

B, LAT = 10e9, 2e-6


def one_layer(n=4_000_000, f=0.01, b=0.02):
    return chain(TraceMeta("one", "V100", 1), [Layer("l0", f, b, param_bytes=n)])


def test_registry_names_are_module_names():
    reg = registry()
    assert list(reg)[:2] == ["dp", "ps"]
    for name, cls in reg.items():
        assert cls.name == name and cls.summary
    with pytest.raises(ConfigError, match="choose one of: dp, ps"):
        get_scheme("allreduce")


@pytest.mark.parametrize("fidelity", ["analytic", "detailed"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_dp_iteration_is_compute_plus_ring_plus_update(fidelity, p):
    n = 4_000_000
    trace = one_layer(n)
    topo = ring_topology(p, B, LAT)
    r = simulate(
        SimConfig(trace=trace, topology=topo, scheme="dp", fidelity=fidelity, iterations=3)
    )
    update = OPTIMIZERS["momentum"][1] * n / topo.gpu_spec.memory_bandwidth_bytes_per_s
    expected = 0.03 + closed_form_ring_allreduce(p, n, LAT, B) + update
    assert r.iteration_time_s == pytest.approx(
        expected, rel=1e-9 if fidelity == "analytic" else 1e-3
    )


def test_dp_on_one_gpu_is_the_single_gpu_baseline():
    trace = synthetic_trace()
    r = simulate(SimConfig(trace=trace, topology=ring_topology(1, B, LAT), scheme="dp"))
    assert r.speedup == pytest.approx(1.0)
    assert r.gpu_utilization == pytest.approx(1.0)
    assert r.comm_bytes_total == 0


def test_dp_buckets_follow_ddp():
    trace = chain(
        TraceMeta("m", "V100", 1),
        [
            Layer(f"l{i}", 0.001, 0.001, param_bytes=s)
            for i, s in enumerate([10, 0, 600, 300, 500, 200])
        ],
    )
    assert ddp_buckets(trace, bucket_bytes=700, first_bucket_bytes=100) == [[5], [4, 3], [2, 0]]


def test_dp_overlap_hides_communication():
    trace = synthetic_trace(n_layers=8, param_bytes=20_000_000)
    topo = ring_topology(4, 2e9, LAT)
    on = simulate(SimConfig(trace=trace, topology=topo, options=DPOptions(bucket_bytes=2**22)))
    off = simulate(
        SimConfig(trace=trace, topology=topo, options=DPOptions(bucket_bytes=2**22, overlap=False))
    )
    assert on.iteration_time_s < off.iteration_time_s


def test_resnet50_on_8_gpus_of_one_box():
    r = simulate(build_config(RunSpec(scheme="dp", gpus=8)))
    assert 5 < r.speedup <= 8
    assert 0 < r.gpu_utilization <= 1
    assert r.model == "resnet50" and r.gpus == 8
    assert r.comm_bytes_by_link_kind["pcie"] > 0


def test_dp_memory_holds_weights_gradients_state_buffers_and_activations():
    trace = synthetic_trace()
    r = simulate(SimConfig(trace=trace, topology=ring_topology(2, B, LAT), optimizer="adam"))
    pb, act = trace.param_bytes, trace.activation_bytes
    assert r.memory_breakdown_bytes["weights"] == pb
    assert r.memory_breakdown_bytes["optimizer"] == 2 * pb
    assert r.peak_memory_bytes == pb * (1 + 1 + 2 + 1) + act


@pytest.mark.parametrize("fused_scheme", ["ps"])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_ps_push_pull_formula(fused_scheme, p):
    """p workers, one dedicated server, one layer of n bytes, equal links on one switch:
    pushes serialise on the server's link ((p+1)·n/B + 2α), the server adds the last push
    (n/R) and updates (5·n/R for momentum), the values serialise back the same way."""
    n, bw, lat, rate = 1_000_000, 1e9, 1e-5, 1e9
    trace = one_layer(n)
    topo = star_topology(p, bw, lat, servers=1)
    opts = PSOptions(placement="dedicated", servers=1, server_bandwidth=rate)
    r = simulate(
        SimConfig(
            trace=trace,
            topology=topo,
            scheme=fused_scheme,
            options=opts,
            iterations=1,
            warmup_iterations=0,
            chunk_bytes=n,
        )
    )
    expected = 0.03 + 2 * (p + 1) * n / bw + 4 * lat + 6 * n / rate
    assert r.iteration_times_s[0] == pytest.approx(expected, rel=1e-12)


def test_ps_shards_follow_mxnet_placement():
    shards = mxnet_shards(
        [(0, 100), (1, 8_000_000), (2, 100)], servers=4, big_array_bytes=4_000_000
    )
    assert [(s.layer, s.server, s.nbytes) for s in shards] == [
        (0, 0, 100),
        (1, 0, 2_000_000),
        (1, 1, 2_000_000),
        (1, 2, 2_000_000),
        (1, 3, 2_000_000),
        (2, 9973 * 2 % 4, 100),
    ]


def test_ps_colocated_on_ethernet_is_slower_than_dp_ring():
    spec = RunSpec(gpus=4, topology="ethernet", model="vgg16", bandwidth="10Gbps")
    ps = simulate(build_config(spec.replace(scheme="ps")))
    dp = simulate(build_config(spec))
    assert ps.throughput_samples_s < dp.throughput_samples_s
    assert ps.extra["servers"] == 4


def test_ps_rejects_colocated_without_hosts():
    b_topo = ring_topology(2, B, LAT)
    b_topo.hosts.clear()
    with pytest.raises(ConfigError, match="no host CPUs"):
        simulate(SimConfig(trace=synthetic_trace(), topology=b_topo, scheme="ps"))


def test_ps_on_builtin_vgg16_four_hosts_runs_every_layer():
    r = simulate(
        build_config(RunSpec(scheme="ps", gpus=4, topology="ethernet", model="vgg16", iterations=2))
    )
    vgg = load_builtin("vgg16")
    assert r.comm_bytes_total > 2 * 4 * vgg.param_bytes  # push and pull per worker
    assert all(0 < u <= 1 for u in r.per_gpu_utilization)


@pytest.mark.parametrize("scheme", ["ps", "p3"])
def test_an_input_node_with_parameters_does_not_stall_parameter_servers(scheme):
    """Input nodes never run backward, so their parameters are never pushed; they must not
    be sharded (it used to stall the run)."""
    trace = chain(
        TraceMeta("m", "V100", 1),
        [
            Layer("in", 0.001, 0.0, param_bytes=1_000_000, kind="input"),
            Layer("l1", 0.01, 0.02, param_bytes=2_000_000),
        ],
    )
    r = simulate(
        SimConfig(trace=trace, topology=star_topology(2, B, LAT), scheme=scheme, iterations=2)
    )
    assert r.iteration_time_s > 0
