"""P3's mean-field model (analytic fidelity): when it applies, that it reproduces the full
model where the two must agree, and that its mirrored accounting matches the full run."""

import re

import pytest

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import SimConfig, simulate
from simcore.config import ConfigError
from simcore.schemes.p3 import P3Options
from simcore.topology import TopologyBuilder
from tests.helpers import star_topology
from traces import load_builtin


def p3(gpus, mean_field="auto", **kw):
    spec = RunSpec(
        scheme="p3",
        fidelity="analytic",
        iterations=2,
        scheme_options={"mean_field": mean_field, **kw.pop("opts", {})},
        gpus=gpus,
        **kw,
    )
    return simulate(build_config(spec, record_spans=False))


def test_two_machines_are_the_full_model_up_to_slice_placement():
    """With two machines nobody is mirrored: the only difference left is that each server
    keeps half of every slice instead of every other slice."""
    kw = {"topology": "ethernet", "model": "vgg16", "bandwidth": "1Gbps"}
    mf, full = p3(2, "on", **kw), p3(2, "off", **kw)
    assert mf.extra["mean_field"] and not full.extra["mean_field"]
    assert not p3(2, **kw).extra["mean_field"]  # auto: not below five machines
    assert mf.iteration_time_s == pytest.approx(full.iteration_time_s, rel=2e-3)
    assert mf.comm_bytes_per_iteration == pytest.approx(full.comm_bytes_per_iteration, rel=1e-9)


@pytest.mark.parametrize("gpus", [16, 32])
def test_mirrored_run_matches_the_full_one_when_links_keep_up(gpus):
    """ResNet-50 on InfiniBand hides its communication: times, per-GPU metrics, payload
    and the bytes on every link of every machine agree with simulating everybody."""
    mf, full = p3(gpus, "on", topology="ib-cluster"), p3(gpus, "off", topology="ib-cluster")
    assert mf.extra["simulated_workers"] == 8 and full.extra["simulated_workers"] == gpus
    assert mf.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-3)
    assert mf.per_gpu_utilization == pytest.approx(full.per_gpu_utilization, rel=1e-3)
    assert mf.per_gpu_peak_memory_bytes == full.per_gpu_peak_memory_bytes
    assert mf.comm_bytes_per_iteration == pytest.approx(full.comm_bytes_per_iteration, rel=1e-3)
    # Every link carries the mean of its place over all machines (servers differ a
    # little in the full model: whole slices are dealt round-robin).
    assert set(mf.comm_bytes_by_link) == set(full.comm_bytes_by_link)
    places: dict[str, list[int]] = {}
    for name, sent in full.comm_bytes_by_link.items():
        places.setdefault(re.sub(r"n\d+\.", "", name), []).append(sent)
    for name, sent in mf.comm_bytes_by_link.items():
        full_sent = places[re.sub(r"n\d+\.", "", name)]
        assert sent == pytest.approx(sum(full_sent) / len(full_sent), rel=1e-3), name
    for kind, sent in full.comm_bytes_by_link_kind.items():
        assert mf.comm_bytes_by_link_kind[kind] == pytest.approx(sent, rel=1e-3), kind


def test_simulated_messages_do_not_grow_with_the_cluster():
    small, big = p3(16, "on", topology="ib-cluster"), p3(128, topology="ib-cluster")
    assert big.extra["mean_field"]
    assert small.messages == big.messages
    assert big.comm_bytes_per_iteration == pytest.approx(
        8 * small.comm_bytes_per_iteration, rel=1e-3
    )
    assert len(set(big.per_gpu_utilization)) == 1


def test_bandwidth_bound_runs_are_never_slower_than_the_full_model():
    """The mean field spreads every slice evenly, so it has no server imbalance: it is a
    bound the full model reaches or exceeds (it can alternate slow and fast iterations)."""
    kw = {"topology": "ethernet", "model": "resnet50", "bandwidth": "1Gbps"}
    mf, full = p3(8, "on", **kw), p3(8, "off", **kw)
    assert mf.iteration_time_s <= full.iteration_time_s * (1 + 1e-9)
    # Each host's link carries (h-1)/h of its pushes and of its server's answers.
    trace_bytes = full.comm_bytes_per_iteration / (2 * 8)
    wire = 2 * trace_bytes * 7 / 8 / (1e9 / 8)
    assert mf.iteration_time_s >= wire


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ({"fidelity": "detailed"}, "analytic fidelity"),
        ({"opts": {"placement": "dedicated"}}, "co-located"),
        ({"opts": {"servers": 3}}, "one server per machine"),
        ({"opts": {"round_robin": "per-key"}}, "per-key"),
        ({"gpus": 22}, "every machine full"),  # the last machine holds 2 of 4 GPUs
        ({"compute_jitter": 0.05}, "jitter"),
        ({"gpus": 4}, "two machines"),
    ],
)
def test_falls_back_to_every_worker_where_the_cluster_is_not_symmetric(case, reason):
    """``auto`` simulates everybody there; ``on`` says why it cannot run."""
    case = dict(case)

    def spec(mode):
        return RunSpec(
            scheme="p3",
            fidelity=case.get("fidelity", "analytic"),
            iterations=1,
            topology="ib-cluster",
            gpus=case.get("gpus", 24),
            scheme_options={**case.get("opts", {}), "mean_field": mode},
            **{k: v for k, v in case.items() if k not in ("fidelity", "gpus", "opts")},
        )

    r = simulate(build_config(spec("auto"), record_spans=False))
    assert r.extra["mean_field"] is False
    assert r.extra["simulated_workers"] == r.gpus
    with pytest.raises(ConfigError, match=reason):
        simulate(build_config(spec("on"), record_spans=False))


def test_auto_starts_at_five_machines():
    assert not p3(16, topology="ib-cluster").extra["mean_field"]
    assert p3(20, topology="ib-cluster").extra["mean_field"]


def test_ps_keeps_the_full_model_below_five_machines():
    r = simulate(
        build_config(
            RunSpec(scheme="ps", gpus=8, topology="ib-cluster", fidelity="analytic", iterations=1),
            record_spans=False,
        )
    )
    assert r.extra["mean_field"] is False


def test_box_twins_pair_every_link_with_the_same_link_of_the_twin_machine():
    spec_cfg = build_config(RunSpec(scheme="dp", gpus=16, topology="ib-cluster"))
    from simcore.engine import resolve_topology

    topo = resolve_topology(spec_cfg, 0)
    pairs = topo.box_twins(lambda b: b % 2)
    names = {topo.links[a].name: topo.links[b].name for a, b in pairs}
    assert names["n2.nic0->switch"] == "n0.nic0->switch"
    assert names["switch->n3.nic0"] == "switch->n1.nic0"
    assert names["n3.gpu2->n3.sw0"] == "n1.gpu2->n1.sw0"
    own = sum(
        1
        for link in topo.links
        if not link.name.startswith(("n0.", "n1.", "switch->n0", "switch->n1"))
    )
    assert len(pairs) == own


def test_box_twins_refuse_machines_built_differently():
    star = star_topology(4, 1e9, 1e-6)
    assert star.box_twins(lambda b: b % 2) is not None
    # Machines 1 and 3 have slower links than 0 and 2: each machine is like its twin, not
    # like machine 0.
    b = TopologyBuilder("alternating")
    for box in range(4):
        b.device(f"gpu{box}", "gpu", box)
    sw = b.device("switch", "switch", -1)
    for box in range(4):
        b.link(box, sw, "ethernet", 1e9 if box % 2 else 1e10, 1e-6)
    topo = b.build([0, 1, 2, 3], hosts=[0, 1, 2, 3])
    assert topo.box_twins(lambda b: b % 2) is None


def test_two_switches_are_not_one_fabric():
    """Machines on two switches joined by a link: the inter-switch link would carry
    traffic the two simulated machines cannot stand for."""
    b = TopologyBuilder("two-switches")
    for box in range(6):
        b.device(f"gpu{box}", "gpu", box)
    sw = [b.device("swA", "switch", -1), b.device("swB", "switch", -1)]
    for box in range(6):
        b.link(box, sw[0], "ethernet", 1e9, 1e-6)
    b.link(sw[0], sw[1], "ethernet", 1e8, 1e-6)
    topo = b.build(list(range(6)), hosts=list(range(6)))
    config = SimConfig(
        trace=load_builtin("resnet50"),
        topology=topo,
        scheme="p3",
        fidelity="analytic",
        options=P3Options(mean_field="on"),
    )
    with pytest.raises(ConfigError, match="one switch"):
        simulate(config)
