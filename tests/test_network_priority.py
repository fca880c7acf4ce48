"""Priority links (detailed and analytic), posted messages, and runs of compute ops: stories
with exact simulated times."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simcore.clock import run_to_end
from simcore.device import Gpu, JitteryGpu, LogNormalFactors
from simcore.network import DEFAULT_CHUNK_BYTES, AnalyticNetwork, DetailedNetwork, make_network
from simcore.topology import TopologyBuilder
from tests.test_network import LAT, B, line, run_messages

C = 1000  # chunk bytes: 1 µs on the wire, 10 µs latency
US = 1e-6


def test_detailed_priority_link_decides_at_each_free_moment_among_those_already_there():
    # The link frees at 1 µs: "mid" (queued at 0.5 µs) beats the second "low" chunk;
    # "high" arrived at 1.5 µs, too late for that service but first for the next.
    sends = [
        (0, 0, 1, 2 * C, 5, "low"),
        (0.5 * US, 0, 1, C, 3, "mid"),
        (1.5 * US, 0, 1, C, 0, "high"),
    ]
    log, _ = run_messages(DetailedNetwork, line(1), sends, chunk_bytes=C, priority=True)
    assert log == [
        ("mid", pytest.approx(2 * US + LAT)),
        ("high", pytest.approx(3 * US + LAT)),
        ("low", pytest.approx(4 * US + LAT)),
    ]


def test_detailed_priority_link_left_idle_serves_a_late_chunk_when_it_came():
    # "a"'s second chunk goes at 1 µs; the link is idle from 2 µs; "b" comes at 5 µs,
    # before the link's next decision is taken (at 12 µs), and still starts at 5 µs.
    sends = [(0, 0, 1, 2 * C, 5, "a"), (5 * US, 0, 1, C, 0, "b")]
    log, net = run_messages(DetailedNetwork, line(1), sends, chunk_bytes=C, priority=True)
    assert log == [("a", pytest.approx(2 * US + LAT)), ("b", pytest.approx(6 * US + LAT))]
    assert all(sent == recv == (3 * C if sent else 0) for _l, sent, recv, _b in net.link_bytes())


def test_detailed_priority_over_two_hops_keeps_one_event_per_chunk_and_hop():
    env = simpy.Environment()
    net = DetailedNetwork(env, line(2), chunk_bytes=C, priority=True)
    done = []
    net.send(0, 2, 3 * C, lambda m: done.append(env.now))
    env.run()
    assert done == [pytest.approx(4 * US + 2 * LAT)]
    assert next(env._eid) == 3 * 2  # 3 chunks x 2 hops


def _two_senders_one_slow_link():
    """a and b -> s -> z; s-z at half the rate (2 µs a chunk), so a backlog forms there."""
    b = TopologyBuilder("two-to-one")
    for name, kind in (("a", "gpu"), ("b", "gpu"), ("z", "gpu"), ("s", "switch")):
        b.device(name, kind, 0)
    b.link("a", "s", "pcie", B, LAT)
    b.link("b", "s", "pcie", B, LAT)
    b.link("s", "z", "pcie", B / 2, LAT)
    return b.build([0, 1, 2])


@pytest.mark.parametrize("loop", [simpy.Environment.run, run_to_end])
def test_detailed_priority_two_hops_an_urgent_chunk_overtakes_a_backlog_at_the_switch(loop):
    # "low" (4 chunks, a -> z) reaches s at 11, 12, 13 and 14 µs; s-z serves its first
    # chunk 11-13 µs and then, each decision taken when the chunk before reaches z
    # (10 µs after it left), the best chunk queued by the link's free moment: the second
    # 13-15 µs, then "high" (b -> z, at s from 14.5 µs) 15-17 µs ahead of the two "low"
    # chunks left, which go 17-19 and 19-21 µs. FIFO would have served "high" last.
    topo = _two_senders_one_slow_link()
    env = simpy.Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=C, priority=True)
    log = []

    def send(src, n, prio, tag):
        net.send(src, topo.gpus[2], n, lambda m: log.append((m.tag, env.now)), prio, tag)

    env.timeout(0).callbacks.append(lambda _e: send(topo.gpus[0], 4 * C, 5, "low"))
    env.timeout(3.5 * US).callbacks.append(lambda _e: send(topo.gpus[1], C, 0, "high"))
    loop(env)
    assert log == [
        ("high", pytest.approx(17 * US + LAT, rel=1e-12)),
        ("low", pytest.approx(21 * US + LAT, rel=1e-12)),
    ]
    starts = {m.tag: m.start_s for m in net.messages}
    assert starts == {"low": 0.0, "high": pytest.approx(3.5 * US, rel=1e-12)}
    assert next(env._eid) == 2 + 5 * 2  # two timeouts, 5 chunks x 2 hops
    sent = {link.name: (s, r) for link, s, r, _b in net.link_bytes() if s}
    assert sorted(sent.values()) == [(C, C), (4 * C, 4 * C), (5 * C, 5 * C)]


def test_analytic_priority_queues_whole_messages_per_link():
    n = 10_000  # 10 µs per message and hop
    sends = [
        (0, 0, 1, n, 5, "bulk"),
        (1 * US, 0, 1, n, 3, "normal"),
        (2 * US, 0, 1, n, 0, "urgent"),
    ]
    env = simpy.Environment()
    net = make_network(env, line(2), "analytic", DEFAULT_CHUNK_BYTES, priority=True)
    log = []
    for at, _s, _d, nbytes, prio, tag in sends:

        def go(_e, nbytes=nbytes, prio=prio, tag=tag):
            net.send(0, 2, nbytes, lambda m: log.append((m.tag, env.now)), prio, tag)

        env.timeout(at).callbacks.append(go)
    env.run()
    t = n / B
    assert log == [
        ("bulk", pytest.approx(2 * t + 2 * LAT)),
        ("urgent", pytest.approx(3 * t + 2 * LAT)),
        ("normal", pytest.approx(4 * t + 2 * LAT)),
    ]
    assert net.chunk_bytes > 1 << 40


def test_analytic_post_returns_the_arrival_time_without_an_event():
    env = simpy.Environment()
    topo = line(3)
    net = AnalyticNetwork(env, topo)
    first = net.post(topo.gpus[0], topo.gpus[1], 10_000, tag="a")
    second = net.post(topo.gpus[0], topo.gpus[1], 5_000, tag="b")
    assert first.end_s == pytest.approx(3 * LAT + 10_000 / B)
    assert second.start_s == pytest.approx(10_000 / B)
    assert second.end_s == pytest.approx(3 * LAT + 15_000 / B)
    assert env.peek() == float("inf")
    assert all(sent == recv for _l, sent, recv, _b in net.link_bytes())


OPS = [(0.5, "forward", f"l{i}", 0, i, -1) for i in range(4)]


def one_by_one(gpu_cls, *args):
    env = simpy.Environment()
    log: list = []
    gpu = gpu_cls(env, 0, 0, "gpu0", log, *args)

    def proc():
        yield env.timeout(1.0)
        for op in OPS:
            yield gpu.compute(*op)

    env.process(proc())
    env.run()
    return log, gpu


def at_once(gpu_cls, *args):
    env = simpy.Environment()
    log: list = []
    gpu = gpu_cls(env, 0, 0, "gpu0", log, *args)
    ends = []

    def proc():
        yield env.timeout(1.0)
        ends.append(gpu.enqueue(OPS[:2]))
        yield gpu.compute_seq(OPS[2:])
        ends.append(env.now)

    env.process(proc())
    env.run()
    return log, gpu, ends, next(env._eid)


def test_runs_of_ops_are_timed_and_logged_as_if_issued_one_by_one():
    log1, gpu1 = one_by_one(Gpu)
    log2, gpu2, ends, events = at_once(Gpu)
    assert log1 == log2
    # Events: the process's start and end, its timeout, and a single Done for four ops.
    assert ends == [2.0, 3.0] and events == 4
    assert gpu2.busy_by_iteration == pytest.approx(gpu1.busy_by_iteration)
    assert sum(gpu2.busy_by_iteration.values()) == pytest.approx(sum(op[0] for op in OPS))


def test_jittery_runs_draw_the_same_factors_in_the_same_order():
    log1, _ = one_by_one(JitteryGpu, LogNormalFactors(np.random.default_rng(7), 0.2))
    log2, *_ = at_once(JitteryGpu, LogNormalFactors(np.random.default_rng(7), 0.2))
    assert log1 == log2
    assert log1[0][4] - log1[0][3] != pytest.approx(0.5)
