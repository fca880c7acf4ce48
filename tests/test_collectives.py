"""Collectives against their closed forms, in both fidelities."""

import math

import pytest
import simpy

from dtsim.resolve import load_preset
from simcore.collectives import (
    Collectives,
    ring_allreduce_steps,
    tree_reduce_steps,
)
from simcore.network import make_network
from simcore.topology import TopologySpec, build_topology
from tests.helpers import (
    closed_form_ring_allreduce,
    closed_form_tree_allreduce,
    ring_topology,
    star_topology,
)

B, LAT = 10e9, 2e-6


def run_collective(topo, fidelity, op, n, ranks=None, chunk=1 << 20, rate_factors=None, **kw):
    env = simpy.Environment()
    net = make_network(env, topo, fidelity, chunk, rate_factors=rate_factors)
    coll = Collectives(net)
    done = []
    ranks = list(range(topo.num_gpus)) if ranks is None else ranks
    getattr(coll, op)(ranks, n, on_done=done.append, **kw)
    env.run()
    return done[0], net


@pytest.mark.parametrize("p", [2, 3, 4, 8, 16])
def test_ring_allreduce_closed_form(p):
    n = 64 * 2**20 * p // p - (64 * 2**20) % p  # divisible by p
    expected = closed_form_ring_allreduce(p, n, LAT, B)
    topo = ring_topology(p, B, LAT)
    analytic, _ = run_collective(topo, "analytic", "allreduce", n, algorithm="ring")
    assert analytic == pytest.approx(expected, rel=1e-12)
    detailed, _ = run_collective(topo, "detailed", "allreduce", n, algorithm="ring")
    assert detailed == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_a_ring_allreduce_goes_at_its_slowest_drawn_uplink(p):
    """Hosts on one switch whose uplinks run at drawn shares of the rate
    (``network.flow_spread``): every ring step waits for its slowest send, so the
    all-reduce takes the closed form at the slowest uplink's rate, in both fidelities."""
    from dataclasses import replace

    from simcore.network import uplink_factors

    n = 8 * 2**20 * p
    topo = replace(star_topology(p, B, LAT / 2), flow_share=0.9, flow_spread=0.1)
    factors = uplink_factors(topo, 11)
    assert len(set(factors.values())) == p
    expected = closed_form_ring_allreduce(p, n, LAT, B * min(factors.values()))
    for fidelity, rel in (("analytic", 1e-12), ("detailed", 0.01)):
        got, _ = run_collective(
            topo, fidelity, "allreduce", n, algorithm="ring", chunk=n // p // 256,
            rate_factors=factors,
        )  # fmt: skip
        assert got == pytest.approx(expected, rel=rel), fidelity


def test_ring_steps_send_each_segment_once_per_phase():
    steps = ring_allreduce_steps(4, 400)
    assert len(steps) == 6
    assert all(len(s) == 4 and all(b == 100 for *_x, b in s) for s in steps)


@pytest.mark.parametrize("p", [2, 4, 5, 8])
def test_tree_allreduce_closed_form(p):
    n = 8 * 2**20
    topo = star_topology(p, B, LAT / 2, kind="nvlink")  # two hops of LAT/2 = one alpha
    expected = closed_form_tree_allreduce(p, n, LAT, B)
    analytic, _ = run_collective(topo, "analytic", "allreduce", n, algorithm="tree")
    # detailed: each message is store-and-forward over two hops in small chunks
    detailed, _ = run_collective(topo, "detailed", "allreduce", n, algorithm="tree", chunk=n // 256)
    assert detailed == pytest.approx(expected, rel=0.01)
    if p & (p - 1) == 0:
        assert analytic == pytest.approx(expected, rel=1e-12)
    else:
        # With 5 ranks on one switch the root's link serialises the extra sends in both
        # models; the analytic walk overlaps their first hop (one latency less).
        assert analytic == pytest.approx(detailed, rel=0.01)
    assert len(tree_reduce_steps(p, 1)) == math.ceil(math.log2(p))


@pytest.mark.parametrize("gpus", [3, 5, 6, 11, 16])
@pytest.mark.parametrize("algorithm", ["tree", "hierarchical"])
def test_analytic_walk_matches_detailed_without_contention(gpus, algorithm):
    """Trees over a group that is not a power of two, on DGX-1's mixed NVLinks: a rank
    with nothing to receive sends at once in both models (the closed form's synchronous
    steps would be up to twice as slow)."""
    topo = build_topology(TopologySpec(load_preset("dgx1"), gpus=gpus))
    n = 64 * 2**20
    analytic, _ = run_collective(topo, "analytic", "allreduce", n, algorithm=algorithm)
    detailed, _ = run_collective(
        topo, "detailed", "allreduce", n, algorithm=algorithm, chunk=64 * 1024
    )
    assert analytic == pytest.approx(detailed, rel=0.01)


def test_reduce_scatter_and_allgather_closed_form():
    p, n = 4, 4_000_000
    topo = ring_topology(p, B, LAT)
    expected = (p - 1) * LAT + (p - 1) / p * n / B
    for op in ("reduce_scatter", "allgather"):
        t, _ = run_collective(topo, "detailed", op, n)
        assert t == pytest.approx(expected, rel=1e-9)


def test_hierarchical_on_uniform_boxes_agrees_across_fidelities():
    topo = build_topology(TopologySpec(load_preset("ib-cluster"), gpus=16))
    n = 64 * 2**20
    analytic, _ = run_collective(topo, "analytic", "allreduce", n, algorithm="hierarchical")
    detailed, _ = run_collective(
        topo, "detailed", "allreduce", n, algorithm="hierarchical", chunk=n // 512
    )
    # Detailed adds (hops - 1) * chunk / B per multi-hop message (store and forward).
    assert detailed == pytest.approx(analytic, rel=0.02)


def test_analytic_charges_the_same_bytes_as_detailed():
    topo = build_topology(TopologySpec(load_preset("pcie"), gpus=8))
    n = 8 * 2**20
    _, det = run_collective(topo, "detailed", "allreduce", n, algorithm="ring")
    _, ana = run_collective(topo, "analytic", "allreduce", n, algorithm="ring")
    for (l1, s1, r1, _b1), (l2, s2, r2, _b2) in zip(det.link_bytes(), ana.link_bytes()):
        assert l1 is l2
        assert s2 == pytest.approx(s1, rel=1e-6, abs=8) and r2 == pytest.approx(r1, abs=8)


def test_analytic_ring_sees_shared_links():
    """Eight GPUs behind one link each way: the ring's two crossings share nothing, but a
    ring over two boxes with one NIC each sends one flow per direction over the fabric."""
    topo = build_topology(TopologySpec(load_preset("pcie"), gpus=16, bandwidth_bytes_per_s=1.25e9))
    n = 16 * 2**20
    t, _ = run_collective(topo, "analytic", "allreduce", n, algorithm="ring")
    assert t == pytest.approx(2 * 15 / 16 * n / 1.25e9, rel=0.01)


def test_single_rank_and_empty_collectives_finish_immediately():
    topo = ring_topology(4, B, LAT)
    assert run_collective(topo, "detailed", "allreduce", 100, ranks=[2], algorithm="ring")[0] == 0
    assert run_collective(topo, "detailed", "allreduce", 0, algorithm="ring")[0] == 0


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="ring, tree, hierarchical"):
        run_collective(ring_topology(2, B, LAT), "detailed", "allreduce", 1, algorithm="star")


@pytest.mark.parametrize("q", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [0, 1, 10, 1000, 4_000_006])
def test_ring_bytes_sent_is_what_the_ring_messages_carry(q, n):
    """Per position, the bytes of its sends in the ring's steps; over the ring, exactly
    2(q-1) n / q... rounded as the steps cut the segments (a real rank counts this)."""
    from simcore.collectives import ring_allreduce_steps, ring_bytes_sent

    per_pos = [0] * q
    for step in ring_allreduce_steps(q, n) if q > 1 else []:
        for src, _dst, b in step:
            per_pos[src] += b
    assert [ring_bytes_sent(i, q, n) for i in range(q)] == per_pos
    assert sum(per_pos) == 2 * (q - 1) * n
