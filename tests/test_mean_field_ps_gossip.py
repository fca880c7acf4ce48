"""The mean-field models of ``ps`` (placement kept) and ``gossip`` (exact by symmetry)
against simulating every worker."""

from __future__ import annotations

import pytest

from dtsim.resolve import build_config, load_preset
from dtsim.spec import RunSpec
from simcore import SimConfig, TopologySpec, simulate
from simcore.config import ConfigError
from simcore.schemes.gossip import mirror_plan, xor_masks
from simcore.schemes.ps import PSOptions, mxnet_shards
from traces import Layer, TraceMeta, chain


def run(scheme: str, gpus: int, mean_field: str, **kw):
    spec = RunSpec(
        scheme=scheme,
        gpus=gpus,
        topology=kw.pop("topology", "ib-cluster"),
        fidelity=kw.pop("fidelity", "analytic"),
        iterations=kw.pop("iterations", 3),
        scheme_options={"mean_field": mean_field, **kw.pop("opts", {})},
        **kw,
    )
    return simulate(build_config(spec, record_spans=False))


# ---- ps --------------------------------------------------------------------------------


def test_ps_auto_uses_the_mean_field_from_five_machines_in_the_analytic_fidelity_only():
    assert not run("ps", 16, "auto", iterations=1).extra["mean_field"]
    assert run("ps", 20, "auto", iterations=1).extra["mean_field"]
    assert not run("ps", 20, "auto", iterations=1, fidelity="detailed").extra["mean_field"]
    with pytest.raises(ConfigError, match="analytic"):
        run("ps", 20, "on", iterations=1, fidelity="detailed")


def test_ps_detailed_results_do_not_depend_on_the_option():
    a = run("ps", 8, "auto", fidelity="detailed", iterations=1)
    b = run("ps", 8, "off", fidelity="detailed", iterations=1)
    assert a.iteration_times_s == b.iteration_times_s
    assert a.comm_bytes_by_link == b.comm_bytes_by_link


@pytest.mark.parametrize("gpus", [20, 32])
def test_ps_mean_field_matches_the_full_model_where_compute_bound(gpus):
    mf, full = run("ps", gpus, "on"), run("ps", gpus, "off")
    assert mf.extra["mean_field"] and mf.extra["simulated_workers"] == 8
    assert mf.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-3)
    # Payload totals are exact: every real push, acknowledgement, request and value.
    assert mf.comm_bytes_total == full.comm_bytes_total
    assert mf.extra["shards"] == full.extra["shards"]
    assert mf.per_gpu_utilization == pytest.approx(full.per_gpu_utilization, rel=1e-3)


def test_ps_mean_field_keeps_the_hash_placement_of_a_hot_array():
    """One 3 MB array (under the 4 MB split bound: whole on one server, server 5 of 8 by
    the hash, not one of the two simulated machines) on 8 one-GPU hosts at 1 Gbps: its
    server receives 7 pushes and sends 7 values through its own link (full duplex: a
    period of at least 7 transfers), which a balanced mean field (each server 1/8 of it)
    would spread over 8 links."""
    n, hosts = 3_000_000, 8
    trace = chain(
        TraceMeta("hot", "V100", 8),
        [Layer("a", 0.001, 0.002, param_bytes=1000), Layer("b", 0.001, 0.002, param_bytes=n)],
    )
    assert [sh.server for sh in mxnet_shards([(0, 1000), (1, n)], hosts, 4_000_000)] == [0, 5]
    topo = TopologySpec(load_preset("ethernet"), hosts, bandwidth_bytes_per_s=1e9 / 8)
    times = {}
    for mode in ("on", "off"):
        r = simulate(
            SimConfig(
                trace=trace,
                topology=topo,
                scheme="ps",
                fidelity="analytic",
                iterations=3,
                options=PSOptions(mean_field=mode),
                record_spans=False,
            )
        )
        times[mode] = r.iteration_time_s
    bound = (hosts - 1) * n / (1e9 / 8)  # 7 pushes in (or 7 values out)
    assert times["off"] > bound
    assert times["on"] > bound  # the concentration is kept
    # The full model's workers drift apart (each waits only for its own values, served
    # one after another), so the hot server receives one iteration's pushes while it
    # sends the last one's values; the mean field keeps the workers in lockstep and
    # serialises the two: pessimistic here, never below the full model.
    assert times["off"] <= times["on"] <= 2 * bound + 2 * trace.compute_s + 0.01


def test_mxnet_placement_is_uneven_for_whole_arrays():
    shards = mxnet_shards([(0, 5_000_000), (1, 1000), (2, 2000), (3, 3000)], 4, 4_000_000)
    servers = [sh.server for sh in shards if sh.layer > 0]
    assert len(set(servers)) == 3 and sum(1 for sh in shards if sh.layer == 0) == 4


def test_ps_at_1024_gpus_answers_and_shows_the_parameter_server_bottleneck():
    r = run("ps", 1024, "auto", iterations=1)
    assert r.extra["mean_field"] and r.gpus == 1024
    compute = run("ps", 20, "auto", iterations=1).iteration_time_s
    assert r.iteration_time_s >= compute * 0.999  # never faster than at 20 GPUs


# ---- gossip ------------------------------------------------------------------------------


def test_gossip_partners_are_rank_xor_a_constant_for_hypercube_schedules():
    assert xor_masks(64, 12, "hypercube", "singer") is not None
    assert xor_masks(64, 12, "hypercube", "none") is not None
    assert xor_masks(64, 12, "hypercube", "shift") is None
    assert xor_masks(64, 12, "dissemination", "singer") is None


@pytest.mark.parametrize(
    "kw", [{}, {"topology": "dgx1"}, {"bandwidth": "10Gbps"}, {"opts": {"shuffle": False}}]
)
def test_gossip_mean_field_against_every_worker(kw):
    mf, full = run("gossip", 64, "on", **dict(kw)), run("gossip", 64, "off", **dict(kw))
    assert mf.extra["mean_field"] and not full.extra["mean_field"]
    assert mf.comm_bytes_total == full.comm_bytes_total
    assert dict(mf.comm_bytes_by_link) == dict(full.comm_bytes_by_link)
    assert mf.per_gpu_peak_memory_bytes == full.per_gpu_peak_memory_bytes
    # Exact up to the order in which simultaneous sends reserve a shared link.
    assert mf.iteration_time_s == pytest.approx(full.iteration_time_s, rel=0.03)


def test_gossip_mean_field_only_where_the_partners_are_symmetric():
    r = run("gossip", 64, "auto", opts={"schedule": "dissemination"})
    assert not r.extra["mean_field"]
    with pytest.raises(ConfigError, match="XOR"):  # from the second cycle on
        run("gossip", 64, "on", iterations=8, opts={"rotation": "shift"})
    assert not run("gossip", 8, "auto").extra["mean_field"]  # two machines
    config = build_config(
        RunSpec(scheme="gossip", gpus=64, topology="ib-cluster", fidelity="detailed")
    )
    from simcore.engine import resolve_topology

    assert isinstance(
        mirror_plan(config, config.options or _default_gossip(), resolve_topology(config, 0)), str
    )


def _default_gossip():
    from simcore.schemes.gossip import GossipOptions

    return GossipOptions()


def test_gossip_at_4096_gpus_answers():
    r = run("gossip", 4096, "auto", iterations=1)
    assert r.extra["mean_field"] and len(r.per_gpu_utilization) == 4096
    assert r.extra["simulated_workers"] == 8
