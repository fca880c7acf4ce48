"""Presets, multi-box clusters and routing."""

from itertools import pairwise

import pytest

from dtsim.resolve import load_preset, topology_presets
from simcore.topology import (
    TopologyBuilder,
    TopologyError,
    TopologySpec,
    build_topology,
)
from simcore.units import parse_rate
from tests.helpers import ring_topology


def build(name, gpus, **kw):
    return build_topology(TopologySpec(preset=load_preset(name), gpus=gpus, **kw))


def test_all_presets_exist():
    assert {"pcie", "dgx1", "dgx-a100", "ethernet", "ib-cluster"} <= set(topology_presets())


@pytest.mark.parametrize("name", ["pcie", "dgx1", "dgx-a100", "ethernet", "ib-cluster"])
@pytest.mark.parametrize("gpus", [1, 3, 8, 20])
def test_every_gpu_reaches_every_other(name, gpus):
    topo = build(name, gpus)
    assert topo.num_gpus == gpus
    for a in topo.gpus:
        for b in topo.gpus:
            route = topo.route(a, b)
            if a != b:
                assert route[0].src == a and route[-1].dst == b
                assert all(x.dst == y.src for x, y in pairwise(route))


def test_boxes_are_filled_as_needed():
    topo = build("dgx1", 20)
    assert topo.num_boxes == 3
    assert [len(b) for b in topo.ranks_by_box()] == [8, 8, 4]
    assert sum(1 for d in topo.devices if d.kind == "nic") == 3
    assert topo.devices[topo.gpus[8]].name == "n1.gpu0"


def test_nic_per_gpu_option():
    topo = build("dgx1", 16, nic_per_gpu=True)
    assert sum(1 for d in topo.devices if d.kind == "nic") == 16
    route = topo.route(topo.gpus[3], topo.gpus[11])
    assert [link.kind for link in route].count("ib") == 2


def test_bandwidth_sets_the_inter_node_rate():
    topo = build("pcie", 16, bandwidth_bytes_per_s=parse_rate("10Gbps"))
    ib = [link for link in topo.links if link.kind == "ib"]
    assert ib and all(link.bandwidth_bytes_per_s == pytest.approx(1.25e9) for link in ib)
    route = topo.route(topo.gpus[0], topo.gpus[8])
    assert min(link.bandwidth_bytes_per_s for link in route) == pytest.approx(1.25e9)


def test_dgx1_routes_over_nvlink_and_ring_uses_direct_links():
    topo = build("dgx1", 8)
    # GPU 0 and 5 share no NVLink: the route takes two NVLink hops, not PCIe and QPI.
    route = topo.route(topo.gpus[0], topo.gpus[5])
    assert [link.kind for link in route] == ["nvlink", "nvlink"]
    order = topo.ring_order
    for i, r in enumerate(order):
        nxt = order[(i + 1) % len(order)]
        assert len(topo.route(topo.gpus[r], topo.gpus[nxt])) == 1


def test_dgx1_has_six_nvlinks_per_gpu():
    topo = build("dgx1", 8)
    for g in topo.gpus:
        lanes = sum(
            link.bandwidth_bytes_per_s / 25e9
            for link in topo.links
            if link.src == g and link.kind == "nvlink"
        )
        assert lanes == pytest.approx(6)


def test_dedicated_servers_hang_off_the_fabric():
    topo = build("ethernet", 4, dedicated_servers=2)
    assert len(topo.servers) == 2
    route = topo.route(topo.gpus[0], topo.servers[1])
    assert route[-1].kind == "ethernet"


def test_ring_topology_closed_form_setting():
    topo = ring_topology(4, 10e9, 1e-6)
    for r in range(4):
        (link,) = topo.route(topo.gpus[r], topo.gpus[(r + 1) % 4])
        assert link.bandwidth_bytes_per_s == 10e9 and link.latency == 1e-6


def test_builder_errors_name_the_problem():
    b = TopologyBuilder()
    b.device("a", "gpu")
    with pytest.raises(TopologyError, match="unknown kind"):
        b.device("b", "toaster")
    with pytest.raises(TopologyError, match="unknown device 'zz'"):
        b.link("a", "zz", "pcie", 1e9, 0)
    b.device("c", "gpu")
    topo = b.build()
    with pytest.raises(TopologyError, match="no route"):
        topo.route(0, 1)


def test_malformed_preset():
    with pytest.raises(TopologyError, match="malformed"):
        build_topology(TopologySpec(preset={"name": "x"}, gpus=2))
