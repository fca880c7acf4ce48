"""The network models, as stories with exact simulated times."""

from itertools import pairwise

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.host import CpuPool
from simcore.network import AnalyticNetwork, DetailedNetwork
from simcore.topology import HostSpec, TopologyBuilder
from simcore.transport import CommCpu, HostTransport

B = 1e9  # bytes/s
LAT = 1e-5  # s


def line(n_hops=1, bw=B, lat=LAT):
    """gpu0 - sw1 - ... - gpu1 with equal links."""
    b = TopologyBuilder("line")
    names = ["a"] + [f"s{i}" for i in range(n_hops - 1)] + ["z"]
    for i, n in enumerate(names):
        b.device(n, "gpu" if i in (0, len(names) - 1) else "switch", 0)
    for x, y in pairwise(names):
        b.link(x, y, "pcie", bw, lat)
    return b.build([0, len(names) - 1])


def run_messages(net_cls, topo, sends, **kw):
    """Send ``(at_s, src_rank, dst_rank, nbytes, priority, tag)`` messages; log arrivals."""
    env = simpy.Environment()
    net = net_cls(env, topo, **kw)
    log = []
    for at, src, dst, n, prio, tag in sends:

        def go(_e, src=topo.gpus[src], dst=topo.gpus[dst], n=n, prio=prio, tag=tag):
            net.send(src, dst, n, lambda m: log.append((m.tag, env.now)), priority=prio, tag=tag)

        ev = env.timeout(at)
        ev.callbacks.append(go)
    env.run()
    return log, net


@pytest.mark.parametrize("net_cls", [DetailedNetwork, AnalyticNetwork])
@pytest.mark.parametrize("n", [1, 1000, 3_000_000])
def test_one_transfer_takes_latency_plus_bytes_over_bandwidth(net_cls, n):
    topo = line(1)
    log, _ = run_messages(net_cls, topo, [(0, 0, 1, n, 0, "m")])
    assert log == [("m", pytest.approx(LAT + n / B, rel=1e-12))]


def test_chunks_pipeline_across_hops():
    # 3 chunks over 2 hops: the last chunk leaves hop 1 at 3c/B, hop 2 at 4c/B.
    c = 1000
    log, _ = run_messages(DetailedNetwork, line(2), [(0, 0, 1, 3 * c, 0, "m")], chunk_bytes=c)
    assert log == [("m", pytest.approx(4 * c / B + 2 * LAT))]


def test_analytic_multi_hop_is_store_free_closed_form():
    log, _ = run_messages(AnalyticNetwork, line(3), [(0, 0, 1, 10_000, 0, "m")])
    assert log == [("m", pytest.approx(3 * LAT + 10_000 / B))]


def test_fifo_contention_serialises_messages_on_a_shared_link():
    n = 1_000_000
    log, _ = run_messages(
        DetailedNetwork,
        line(1),
        [(0, 0, 1, n, 0, "first"), (0, 0, 1, n, 0, "second")],
        chunk_bytes=n,
    )
    assert log == [
        ("first", pytest.approx(n / B + LAT)),
        ("second", pytest.approx(2 * n / B + LAT)),
    ]


def test_opposite_directions_do_not_contend():
    n = 1_000_000
    log, _ = run_messages(DetailedNetwork, line(1), [(0, 0, 1, n, 0, "ab"), (0, 1, 0, n, 0, "ba")])
    assert sorted(t for _, t in log) == [pytest.approx(n / B + LAT)] * 2


def test_priority_queue_lets_urgent_chunks_jump_ahead_but_never_preempts():
    c = 1000
    # "bulk" (priority 5) starts first and holds the link for one chunk; "urgent"
    # (priority 0) arrives while the first bulk chunk is on the wire and goes next.
    sends = [(0, 0, 1, 4 * c, 5, "bulk"), (0.5 * c / B, 0, 1, c, 0, "urgent")]
    log, _ = run_messages(DetailedNetwork, line(1), sends, chunk_bytes=c, priority=True)
    assert log[0] == ("urgent", pytest.approx(2 * c / B + LAT))
    assert log[1] == ("bulk", pytest.approx(5 * c / B + LAT))
    fifo, _ = run_messages(DetailedNetwork, line(1), sends, chunk_bytes=c, priority=False)
    assert [tag for tag, _ in fifo] == ["bulk", "urgent"]


# ---- fair sharing (TCP connections through one bottleneck) ------------------------------
def star(sharing: str, bw: float = B, lead_s: float = 0.0):
    """Ranks a, b, c, each on its own link to switch s (a link direction each way)."""
    b = TopologyBuilder("star")
    for name in "abc":
        b.device(name, "gpu", 0)
    b.device("s", "switch", -1)
    for name in "abc":
        b.link(name, "s", "ethernet", bw, LAT)
    return b.build([0, 1, 2], link_sharing=sharing, link_lead_s=lead_s)


def test_fair_flows_out_of_one_link_finish_together_where_fifo_serves_one_first():
    """a sends two equal messages at once, to b and to c, over its one link: FIFO
    delivers one after n/B and the other after 2n/B; fair sharing interleaves the two
    flows chunk by chunk, so both take about 2n/B (the first within a chunk of the
    second). (Flows from different links meet at the switch interleaved already.)"""
    n, c = 1_000_000, 10_000
    sends = [(0, 0, 1, n, 0, "to b"), (0, 0, 2, n, 0, "to c")]
    fifo, _ = run_messages(DetailedNetwork, star("fifo"), sends, chunk_bytes=c)
    fair, _ = run_messages(DetailedNetwork, star("fair"), sends, chunk_bytes=c)
    assert [t for _, t in fifo] == [
        pytest.approx(n / B + c / B + 2 * LAT),
        pytest.approx(2 * n / B + c / B + 2 * LAT),
    ]
    first, second = sorted(t for _, t in fair)
    assert second == pytest.approx(2 * n / B + c / B + 2 * LAT)
    assert second - c / B <= first + 1e-12 < second


def test_a_fair_link_lets_a_small_message_past_a_large_one_to_another_peer():
    """a sends 1 MB to c, then 20 kB to b: FIFO holds the small one behind every byte of the
    large one on a's link; fair sharing alternates the two flows' chunks, so it arrives
    after about twice its own time."""
    big, small, c = 1_000_000, 20_000, 10_000
    sends = [(0, 0, 2, big, 0, "big"), (0, 0, 1, small, 0, "small")]
    fifo, _ = run_messages(DetailedNetwork, star("fifo"), sends, chunk_bytes=c)
    fair, _ = run_messages(DetailedNetwork, star("fair"), sends, chunk_bytes=c)
    assert dict(fifo)["small"] > big / B
    assert dict(fair)["small"] == pytest.approx(2 * small / B + c / B + 2 * LAT)
    assert dict(fair)["big"] == pytest.approx(dict(fifo)["big"] + small / B)


def test_a_flow_alone_on_fair_links_takes_what_it_takes_on_fifo_links():
    sends = [(0, 0, 2, 123_456, 0, "m"), (1.0, 1, 0, 7_777, 0, "later")]
    fifo, _ = run_messages(DetailedNetwork, star("fifo"), sends, chunk_bytes=4096)
    fair, _ = run_messages(DetailedNetwork, star("fair"), sends, chunk_bytes=4096)
    assert fair == [(tag, pytest.approx(t)) for tag, t in fifo]


@pytest.mark.parametrize("lead_s", [0.0, 100e-6, 300e-6, 600e-6])
def test_a_flow_already_sending_goes_on_alone_for_the_lead_then_shares(lead_s):
    """a sends n to c, and 105 us later n to b, on fair links whose flows already sending
    go on ``lead_s`` before a newcomer's turn: the first flow has sent 100 kB (10 whole
    chunks) by then, sends lead_s * B more alone, then the two alternate, so it is done
    after ``n + (n - 100 kB - lead_s * B)`` bytes' time (FIFO's when the lead covers its
    rest); the second always after both messages' bytes."""
    n, c, d = 1_000_000, 10_000, 105e-6
    sends = [(0, 0, 2, n, 0, "first"), (d, 0, 1, n, 0, "second")]
    log, _ = run_messages(DetailedNetwork, star("fair", lead_s=lead_s), sends, chunk_bytes=c)
    got = dict(log)
    rest = max(0.0, n - 100_000 - lead_s * B)
    assert got["first"] == pytest.approx((n + rest) / B + c / B + 2 * LAT, abs=c / B)
    assert got["second"] == pytest.approx(2 * n / B + c / B + 2 * LAT)


def test_a_link_lead_below_zero_is_refused() -> None:
    from simcore.topology import TopologyError

    with pytest.raises(TopologyError, match=r"network\.lead must be a time of 0 or more"):
        star("fair", lead_s=-1e-3)


def test_priorities_still_go_first_on_fair_links():
    """Among flows of equal priority a fair link takes turns; a lower priority number
    still goes before them (P3's slices on a cluster preset that shares fairly)."""
    c = 1000
    sends = [(0, 0, 2, 10 * c, 5, "bulk"), (0.5 * c / B, 1, 2, 2 * c, 0, "urgent")]
    log, _ = run_messages(DetailedNetwork, star("fair"), sends, chunk_bytes=c, priority=True)
    assert [tag for tag, _ in log] == ["urgent", "bulk"]


def test_an_unknown_link_sharing_is_refused_with_the_choices():
    from simcore.topology import TopologyError

    with pytest.raises(
        TopologyError, match="'round-robin' is not allowed; choose one of fifo, fair"
    ):
        star("round-robin")


@pytest.mark.parametrize(
    "net_cls, kw, sharing",
    [
        (DetailedNetwork, {"chunk_bytes": 777}, "fifo"),
        (DetailedNetwork, {"chunk_bytes": 777}, "fair"),
        (DetailedNetwork, {"priority": True, "chunk_bytes": 500}, "fifo"),
        (DetailedNetwork, {"priority": True, "chunk_bytes": 500}, "fair"),
        (AnalyticNetwork, {}, "fifo"),
    ],
)
def test_bytes_sent_equal_bytes_received_on_every_link(net_cls, kw, sharing):
    topo = line(3) if sharing == "fifo" else star(sharing)
    sends = [(i * 1e-6, i % 2, 1 - i % 2, 1000 + 37 * i, i % 3, str(i)) for i in range(20)]
    log, net = run_messages(net_cls, topo, sends, **kw)
    assert len(log) == 20
    for _link, sent, recv, busy in net.link_bytes():
        assert sent == recv
        assert busy >= 0


def test_local_and_empty_messages_arrive_at_once():
    log, _ = run_messages(
        DetailedNetwork, line(1), [(0.5, 0, 0, 100, 0, "self"), (0.5, 0, 1, 0, 0, "empty")]
    )
    assert log == [("self", 0.5), ("empty", 0.5)]


# ---- token buckets (tc tbf on an emulated cluster's links) ---------------------------------
def shaped_line(burst, peak, bw=B):
    b = TopologyBuilder("tbf")
    b.device("a", "gpu", 0)
    b.device("z", "gpu", 0)
    b.link("a", "z", "ethernet", bw, LAT, 1, burst, peak)
    return b.build([0, 1])


@pytest.mark.parametrize("priority", [False, True])
def test_a_message_within_the_burst_leaves_at_peak_speed(priority):
    log, _ = run_messages(
        DetailedNetwork, shaped_line(10_000, 10 * B), [(0, 0, 1, 8000, 0, "m")], priority=priority
    )
    assert log == [("m", pytest.approx(LAT + 8000 / (10 * B)))]


@pytest.mark.parametrize("chunk", [1000, 1 << 20])
def test_a_long_transfer_gets_the_burst_then_the_rate(chunk):
    """1 MB through a 10 kB bucket: the first 10 kB are free, the rest goes at the rate."""
    n = 1_000_000
    log, _ = run_messages(
        DetailedNetwork, shaped_line(10_000, 10 * B), [(0, 0, 1, n, 0, "m")], chunk_bytes=chunk
    )
    assert log == [("m", pytest.approx(LAT + (n - 10_000) / B, rel=1e-9))]


def test_the_bucket_refills_at_the_rate():
    """Two 10 kB bursts: back to back the second waits for tokens; after 10 us of idling
    (10 kB at the rate) it goes at peak speed again."""
    peak, burst = 10 * B, 10_000
    back_to_back, _ = run_messages(
        DetailedNetwork,
        shaped_line(burst, peak),
        [(0, 0, 1, burst, 0, "a"), (0, 0, 1, burst, 0, "b")],
    )
    assert back_to_back[1] == ("b", pytest.approx(LAT + burst / B))
    spaced, _ = run_messages(
        DetailedNetwork,
        shaped_line(burst, peak),
        [(0, 0, 1, burst, 0, "a"), (burst / B, 0, 1, burst, 0, "b")],
    )
    assert spaced[1] == ("b", pytest.approx(burst / B + LAT + burst / peak))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 200_000), min_size=1, max_size=12),
    gaps=st.lists(st.floats(0, 1e-3), min_size=12, max_size=12),
    burst=st.integers(0, 100_000),
)
def test_a_bucket_never_slows_a_link_and_never_beats_rate_plus_burst(sizes, gaps, burst):
    """Against the same link unshaped-at-the-rate, every message arrives no later; and by
    any arrival the bytes delivered are at most the burst plus the rate times the time."""
    t, sends = 0.0, []
    for i, (n, gap) in enumerate(zip(sizes, gaps)):
        t += gap
        sends.append((t, 0, 1, n, 0, i))
    plain, _ = run_messages(DetailedNetwork, line(1), sends, chunk_bytes=4096)
    shaped, _ = run_messages(DetailedNetwork, shaped_line(burst, 100 * B), sends, chunk_bytes=4096)
    plain_at, shaped_at = dict(plain), dict(shaped)
    for i in plain_at:
        assert shaped_at[i] <= plain_at[i] + 1e-12
    delivered = 0
    for i, at in sorted(shaped_at.items(), key=lambda kv: kv[1]):
        delivered += sizes[i]
        assert delivered <= burst + 4096 + B * (at - LAT) + 1e-6


# ---- what a shaped link holds to its rate (the CPU its packet work costs) -------------------
class _Charges(CommCpu):
    """The CPU side of messages on one 1-core machine, recording the packet work charged."""

    def __init__(self, env: simpy.Environment) -> None:
        self.pool = CpuPool(env, 1)
        spec = HostSpec(cores=1, link_cpu_s_per_byte=1e-9, link_cpu_two_pairs_s_per_byte=5e-10)
        super().__init__(spec, lambda _d: self.pool)
        self.held: list[tuple[int, int, float]] = []

        self.busy: list[int] = []

    def background(self, src: int, dst: int, nbytes: int, busy_directions: int = 0) -> None:
        self.held.append((src, dst, nbytes))
        self.busy.append(busy_directions)
        super().background(src, dst, nbytes, busy_directions)


def test_a_bucket_counts_the_bytes_it_held_to_the_rate():
    """1 MB through a 10 kB bucket (peak 10x the rate): the first bytes go at peak speed
    while the bucket lasts, the rest is held: n - burst * peak / (peak - rate) bytes."""
    topo = shaped_line(10_000, 10 * B)
    env = simpy.Environment()
    net = DetailedNetwork(env, topo)
    st = net.state[0]
    st.transmit(0.0, 1_000_000)
    assert st.held_bytes == pytest.approx(1_000_000 - 10_000 * 10 / 9)
    fresh = DetailedNetwork(simpy.Environment(), topo).state[0]
    fresh.transmit(0.0, 8_000)  # within the bucket
    assert fresh.held_bytes == 0


@pytest.mark.parametrize("fair", [False, True])
def test_packet_work_is_charged_once_per_route_for_the_bytes_held(fair):
    """Two shaped links in a row: the second gets the bytes at the rate already, so only
    the first one's held bytes are charged (a chunk stored and forwarded whole would look
    held again); nothing is charged without a host transport."""
    b = TopologyBuilder("tbf2")
    b.device("a", "gpu", 0)
    b.device("s", "switch", -1)
    b.device("z", "gpu", 1)
    b.link("a", "s", "ethernet", B, LAT, 1, 10_000, 10 * B)
    b.link("s", "z", "ethernet", B, LAT, 1, 10_000, 10 * B)
    b_topo = b.build([0, 2], link_sharing="fair" if fair else "fifo")
    env = simpy.Environment()
    net = DetailedNetwork(env, b_topo, chunk_bytes=100_000)
    cpu = HostTransport(net, _Charges(env)).cpu
    n = 1_000_000
    net.send(b_topo.gpus[0], b_topo.gpus[1], n)
    env.run()
    charged = sum(x for _s, _d, x in cpu.held)
    assert charged == pytest.approx(n - 10_000 * 10 / 9)
    assert {(s, d) for s, d, _x in cpu.held} == {(b_topo.gpus[0], b_topo.gpus[1])}
    assert cpu.pool.busy_s == pytest.approx(2 * 1e-9 * charged)  # both ends, one machine


def _four_shaped_hosts(link_sharing: str = "fifo"):
    b = TopologyBuilder("tbf4")
    b.device("s", "switch", -1)
    for i in range(4):
        b.device(f"h{i}", "gpu", i)
        b.link(f"h{i}", "s", "ethernet", B, LAT, 1, 10_000, 10 * B)
    return b.build([1, 2, 3, 4], link_sharing=link_sharing)


def _exchange_pairs(net, topo, pairs: int) -> None:
    g = topo.gpus
    for a, z in [(0, 1), (2, 3)][:pairs]:
        net.send(g[a], g[z], 1_000_000)
        net.send(g[z], g[a], 1_000_000)


@pytest.mark.parametrize("pairs", [1, 2])
def test_packet_work_is_charged_with_the_links_busy_at_the_time(pairs):
    """Four hosts on a switch, every link direction shaped, flows sharing links fairly
    chunk by chunk (as the emulated cluster's preset has them): one pair exchanging both
    ways keeps four directions busy, two pairs at once eight, and the charges as the
    chunks go see that many, but for the first chunks (the cost per byte depends on it:
    ``HostSpec.link_cpu``)."""
    topo = _four_shaped_hosts("fair")
    env = simpy.Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=100_000)
    cpu = HostTransport(net, _Charges(env)).cpu
    _exchange_pairs(net, topo, pairs)
    env.run()
    assert max(cpu.busy) == 4 * pairs and min(cpu.busy) >= 1
    at_load = sum(x for (_s, _d, x), n in zip(cpu.held, cpu.busy) if n == 4 * pairs)
    assert at_load > 0.75 * sum(x for _s, _d, x in cpu.held)  # all but the start
    # each charge at its load's cost, at both ends (one machine here)
    spec = cpu.spec
    cost = sum(2 * x * spec.link_cpu(n) for (_s, _d, x), n in zip(cpu.held, cpu.busy))
    assert cpu.pool.busy_s == pytest.approx(cost)


def test_the_analytic_model_sees_more_links_busy_with_more_pairs():
    """Without buckets the analytic model counts what the directions have reserved:
    each charge (at a message's arrival) of two pairs at once sees twice as many busy
    directions as one pair's."""
    seen = {}
    for pairs in (1, 2):
        topo = _four_shaped_hosts()
        env = simpy.Environment()
        net = AnalyticNetwork(env, topo)
        cpu = HostTransport(net, _Charges(env)).cpu
        _exchange_pairs(net, topo, pairs)
        env.run()
        seen[pairs] = set(cpu.busy)
    assert len(seen[1]) == len(seen[2]) == 1
    assert 2 * min(seen[1]) == min(seen[2]) > 0


def test_the_cost_per_byte_follows_the_busy_link_directions():
    """One pair's cost up to four busy directions, two pairs' from eight on, the line
    between them in between; without a two-pair cost the one-pair cost throughout."""
    spec = HostSpec(link_cpu_s_per_byte=6e-9, link_cpu_two_pairs_s_per_byte=4e-9)
    costs = [spec.link_cpu(n) for n in range(11)]
    assert costs[:5] == [6e-9] * 5 and costs[8:] == [4e-9] * 3
    assert costs[6] == pytest.approx(5e-9)
    assert all(a >= b for a, b in pairwise(costs))
    assert {HostSpec(link_cpu_s_per_byte=6e-9).link_cpu(n) for n in range(11)} == {6e-9}
    # only then does the network count the busy directions for a charge
    assert spec.link_cpu_by_load and not HostSpec(link_cpu_s_per_byte=6e-9).link_cpu_by_load


# ---- concurrent flows' uneven shares (network.flow_share, network.flow_spread) ----------


def spread_star(share: float, spread: float, n: int = 3):
    """``n`` ranks, each on its own link to one switch, with a flow share and spread."""
    b = TopologyBuilder("star")
    for i in range(n):
        b.device(f"r{i}", "gpu", i)
    b.device("s", "switch", -1)
    for i in range(n):
        b.link(f"r{i}", "s", "ethernet", B, LAT)
    return b.build(list(range(n)), flow_share=share, flow_spread=spread)


def test_cpu_hosts_draw_no_uplink_factors_and_device_hosts_do():
    """On CPU hosts the flows' shortfall is the shared cores' work, which the host model
    charges: no rate factors there; hosts with devices (emulated or GPU) draw them."""
    from dataclasses import replace

    from simcore.network import uplink_factors
    from simcore.topology import GpuSpec, HostSpec

    topo = spread_star(0.8, 0.05, n=4)
    cpu = replace(topo, host_spec=HostSpec(cores=2, shared=True), gpu_spec=GpuSpec(kind="cpu"))
    device = replace(cpu, gpu_spec=GpuSpec(kind="gpu"))
    assert uplink_factors(cpu, 0) == {}
    assert uplink_factors(device, 0) == uplink_factors(topo, 0) != {}


def test_uplink_factors_scale_only_the_links_into_a_switch_and_follow_the_seed():
    from simcore.network import uplink_factors

    topo = spread_star(0.9, 0.05, n=4)
    f0 = uplink_factors(topo, 0)
    ups = {link.index for link in topo.links if topo.devices[link.dst].kind == "switch"}
    assert set(f0) == ups and len(ups) == 4
    assert f0 == uplink_factors(topo, 0)  # one seed, one draw
    assert f0 != uplink_factors(topo, 1)
    assert uplink_factors(spread_star(0.9, 0.0), 3) == dict.fromkeys(
        (link.index for link in spread_star(0.9, 0.0).links if link.dst == 3), 0.9
    )
    assert uplink_factors(spread_star(1.0, 0.0), 0) == {}  # nothing measured, nothing drawn


@settings(max_examples=30, deadline=None)
@given(share=st.floats(0.5, 1.0), spread=st.floats(0.0, 0.3), seed=st.integers(0, 10**6))
def test_uplink_factors_have_the_measured_mean_and_spread_over_many_links(share, spread, seed):
    """Log-normal factors of mean ``share`` and coefficient of variation ``spread``,
    capped at 1: over 4000 uplinks none is above 1, and where the cap rarely bites
    (``share`` three spreads below 1) the sample's mean and CV are within a few of their
    standard errors."""
    import statistics

    from simcore.network import uplink_factors

    f = list(uplink_factors(spread_star(share, spread, n=4000), seed).values()) or [1.0]
    assert max(f) <= 1.0
    if share * (1 + 3 * spread) > 1.0:
        return
    mean = statistics.fmean(f)
    assert mean == pytest.approx(share, rel=6 * spread / 4000**0.5 + 1e-12)
    cv = statistics.pstdev(f) / mean
    assert cv == pytest.approx(spread, abs=0.15 * spread + 1e-12)


@pytest.mark.parametrize("net_cls", [DetailedNetwork, AnalyticNetwork])
def test_a_flow_goes_at_its_senders_drawn_rate(net_cls):
    """A message from r0 to r1 takes its bytes over r0's uplink rate as drawn (the
    downlink keeps the full rate, so the uplink is the bottleneck)."""
    from simcore.network import uplink_factors

    topo = spread_star(0.8, 0.1)
    factors = uplink_factors(topo, 7)
    up = next(link.index for link in topo.links if link.src == 0)
    n = 3_000_000
    env = simpy.Environment()
    c = 1000  # the detailed model's chunk: its last one crosses the downlink after
    kw = {"chunk_bytes": c} if net_cls is DetailedNetwork else {}
    net = net_cls(env, topo, rate_factors=factors, **kw)
    got = []
    net.send(0, 1, n, lambda m: got.append(env.now))
    env.run()
    tail = c / B if net_cls is DetailedNetwork else 0.0
    assert got == [pytest.approx(n / (B * factors[up]) + tail + 2 * LAT, rel=1e-9)]


@pytest.mark.parametrize(
    "share, spread, message",
    [
        (0.0, 0.0, r"network\.flow_share must be in \(0, 1\], got 0\.0"),
        (1.2, 0.0, r"network\.flow_share must be in \(0, 1\], got 1\.2"),
        (0.9, -0.1, r"network\.flow_spread must be in \[0, 1\), got -0\.1"),
    ],
)
def test_a_flow_share_or_spread_out_of_range_is_refused(share, spread, message):
    from simcore.topology import TopologyError

    with pytest.raises(TopologyError, match=message):
        spread_star(share, spread)
