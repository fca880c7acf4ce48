"""CPU hosts: processor sharing, the CPU cost of messages, gloo's segments and two
threads, the sender of point-to-point messages, and the properties every simulation keeps
(theory first: closed forms on tiny cases, then Hypothesis)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simpy import Environment

from dtsim.resolve import load_preset
from simcore import SimConfig, simulate
from simcore.host import CpuPool, CpuStream
from simcore.topology import GlooSpec, TopologyError, TopologySpec, build_topology
from simcore.transport import CommCpu, HostTransport
from traces.model import Layer, TraceMeta, chain

MB = 1_000_000
SHAPING = ("burst_bytes", "peak_bandwidth_bytes_per_s")
"""The netns preset's tbf bucket (``network`` keys)."""


def trace(n_layers: int = 4, fwd_s: float = 0.01, param_bytes: int = 1 * MB) -> object:
    layers = [
        Layer(f"l{i}", fwd_s, 2 * fwd_s, param_bytes=param_bytes, activation_bytes=10_000)
        for i in range(n_layers)
    ]
    return chain(TraceMeta("t", "cpu", 8), layers)


def preset(cores: int = 2, **host: float) -> dict:
    p = copy.deepcopy(load_preset("netns"))
    p["host"] = {"cores": cores, "shared": True, **host}
    return p


def run(p: dict, gpus: int, scheme: str = "dp", **kw) -> object:
    cfg = SimConfig(
        trace=kw.pop("trace", None) or trace(),
        topology=TopologySpec(p, gpus),
        scheme=scheme,
        iterations=kw.pop("iterations", 3),
        **kw,
    )
    return simulate(cfg)


# ---- the pool --------------------------------------------------------------------------
def finish_times(cores: int, works: list[float], starts: list[float] | None = None) -> list:
    env = Environment()
    pool = CpuPool(env, cores)
    done = [None] * len(works)
    starts = starts or [0.0] * len(works)

    def submit(i: int):
        yield env.timeout(starts[i])
        pool.run(works[i], lambda: done.__setitem__(i, env.now))

    for i in range(len(works)):
        env.process(submit(i))
    env.run()
    return done


def test_processor_sharing_closed_forms():
    # Three equal tasks on two cores share them: each runs at 2/3 and ends at 1.5 s.
    assert finish_times(2, [1.0, 1.0, 1.0]) == pytest.approx([1.5, 1.5, 1.5])
    # Fewer tasks than cores: each has a core of its own.
    assert finish_times(4, [1.0, 2.0]) == pytest.approx([1.0, 2.0])
    # One core, 1 s and 2 s: both at half speed until 2 s, then the longer alone.
    assert finish_times(1, [1.0, 2.0]) == pytest.approx([2.0, 3.0])
    # A task arriving later slows the running ones only from then on.
    assert finish_times(1, [1.0, 1.0], [0.0, 0.5]) == pytest.approx([1.5, 2.0])


@settings(max_examples=60, deadline=None)
@given(
    cores=st.integers(1, 4),
    works=st.lists(st.floats(0.001, 2.0), min_size=1, max_size=8),
)
def test_pool_is_work_conserving(cores, works):
    """Tasks that start together end when a plain phase-by-phase reference says (each
    phase: the ``n`` tasks left run at ``min(1, cores/n)`` until the shortest is done), and
    never before total work / cores or the longest task."""
    left = sorted(works)
    t, ends = 0.0, []
    while left:
        rate = min(1.0, cores / len(left))
        step = left[0] / rate
        t += step
        left = [w - step * rate for w in left[1:]]
        ends.append(t)
    got = sorted(finish_times(cores, works))
    assert got == pytest.approx(ends, rel=1e-9, abs=1e-9)
    assert got[-1] >= max(sum(works) / cores, max(works)) - 1e-9


def run_per_core(
    cores: int, balance_s: float, jobs: list[tuple[float, float, object]]
) -> tuple[list, CpuPool]:
    """End times of ``(start_s, work_s, thread)`` jobs on a pool with per-core queues,
    and the pool."""
    env = Environment()
    pool = CpuPool(env, cores, balance_s)
    done = [None] * len(jobs)

    def submit(i: int, start: float, work: float, thread: object):
        yield env.timeout(start)
        pool.run(work, lambda: done.__setitem__(i, env.now), thread=thread)

    for i, job in enumerate(jobs):
        env.process(submit(i, *job))
    env.run()
    return done, pool


def per_core_ends(cores: int, balance_s: float, jobs: list[tuple[float, float, object]]) -> list:
    return run_per_core(cores, balance_s, jobs)[0]


def test_per_core_queues_closed_forms():
    # Three 1 s tasks on two cores: two share core 0 at half speed, one has core 1; when
    # it is done, core 1 stays idle: the pair ends at 1 + 0.5 * 2 (processor sharing
    # over both cores: all at 1.5 s).
    jobs = [(0.0, 1.0, "a"), (0.0, 1.0, "b"), (0.0, 1.0, "c")]
    assert per_core_ends(2, 1e3, jobs) == pytest.approx([2.0, 1.0, 2.0])
    # With a 0.2 s balancing delay core 1 takes one of them over at 1.2 s (0.4 s left
    # each): both end at 1.6 s.
    assert per_core_ends(2, 0.2, jobs) == pytest.approx([1.6, 1.0, 1.6])


def test_a_woken_thread_goes_to_an_idle_core_else_back_to_its_own():
    # a runs 1 s on core 0, b 10 s on core 1; c arrives at 1.1 s on the idle core 0; a
    # wakes at 2 s with no core idle and goes back to core 0, sharing it with c (ends at
    # 4 s); processor sharing over both cores would end it at 3.5 s
    jobs = [(0.0, 1.0, "a"), (0.0, 10.0, "b"), (1.1, 10.0, "c"), (2.0, 1.0, "a")]
    ends = per_core_ends(2, 1e3, jobs)
    assert ends[0] == pytest.approx(1.0) and ends[3] == pytest.approx(4.0)
    # had a core been idle at 2 s, a would have run alone there
    jobs = [(0.0, 1.0, "a"), (0.0, 1.5, "b"), (1.1, 10.0, "c"), (2.0, 1.0, "a")]
    assert per_core_ends(2, 1e3, jobs)[3] == pytest.approx(3.0)


@settings(max_examples=60, deadline=None)
@given(
    cores=st.integers(1, 4),
    balance_s=st.sampled_from([1e-3, 0.1, 1e3]),
    jobs=st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(0.001, 2.0), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    ),
)
def test_per_core_queues_do_all_work_and_never_beat_the_cores(cores, balance_s, jobs):
    """Every task ends, no sooner than its own work after its start; the cores did exactly
    the work given and never more than ``cores`` at once; nothing ends later than all the
    work done one after the other."""
    ends, pool = run_per_core(cores, balance_s, jobs)
    works = [w for _, w, _ in jobs]
    assert all(e is not None for e in ends)
    for (start, work, _), end in zip(jobs, ends, strict=True):
        assert end >= start + work - 1e-9
    assert pool.busy_s == pytest.approx(sum(works), rel=1e-9, abs=1e-9)
    last = max(ends)
    first = min(s for s, _, _ in jobs)
    assert last >= first + sum(works) / cores - 1e-9
    assert last <= max(s for s, _, _ in jobs) + sum(works) + 1e-9


def test_stream_runs_its_tasks_in_order():
    env = Environment()
    pool = CpuPool(env, 2)
    log = []
    s = CpuStream(pool, lambda a, b, info: log.append((info, a, b)))
    for i in range(3):
        s.submit(0.5, i)
    env.run()
    assert log == [(0, 0.0, 0.5), (1, 0.5, 1.0), (2, 1.0, 1.5)]


# ---- ranks on shared cores ---------------------------------------------------------------
@pytest.mark.parametrize(("scheme", "n"), [("dp", 3), ("gpipe", 2), ("pipedream", 3), ("ps", 2)])
def test_cpu_ranks_equal_gpus_when_cores_and_communication_are_free(scheme, n):
    """With a core per rank, no CPU cost of messages and gloo behaving as one stream, CPU
    ranks give the GPU model's times (the host model adds nothing by itself). A server
    on a CPU adds at the host's reduction cost and updates at its memory bandwidth, which
    here equal the GPU model's server bandwidth (20 GB/s)."""
    cpu = preset(cores=8, reduce_cpu_s_per_byte=1 / 20e9)
    cpu["gloo"] = {"segment_bytes": "1GiB", "threads": 1}
    cpu["gpu"]["memory_bandwidth_bytes_per_s"] = "1e15B/s" if scheme == "dp" else "20GB/s"
    gpu = copy.deepcopy(cpu)
    gpu["gpu"] = {**gpu["gpu"], "kind": "gpu"}
    del gpu["host"], gpu["gloo"]
    a = run(cpu, n, scheme)
    b = run(gpu, n, scheme)
    # (DDP's bucket copies at 1e15 B/s add nanoseconds)
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-6)
    assert a.comm_bytes_per_iteration == b.comm_bytes_per_iteration


def test_oversubscribed_cores_stretch_compute():
    """Compute-only data parallelism (a fast network, no CPU cost of messages): three ranks
    on two cores take 3/2 as long as on three cores."""
    tr = trace(param_bytes=4)
    fast = {"bandwidth_bytes_per_s": "1TB/s", "latency_s": "0us"}
    times = {}
    for cores in (2, 3):
        p = preset(cores=cores)
        p["network"] = {**p["network"], **fast}
        times[cores] = run(p, 3, trace=tr).iteration_time_s
    assert times[2] == pytest.approx(1.5 * times[3], rel=0.02)


def test_message_cpu_cost_slows_compute_that_shares_the_cores():
    p = preset(cores=2)
    costly = preset(cores=2, copy_cpu_s_per_byte=5e-9, message_cpu_s=1e-3)
    base = run(p, 2)
    slow = run(costly, 2)
    assert slow.iteration_time_s > base.iteration_time_s
    assert slow.comm_bytes_per_iteration == base.comm_bytes_per_iteration


def test_utilisation_counts_wall_time_of_shared_cores():
    r = run(preset(cores=1), 2, trace=trace(param_bytes=4))
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in r.per_gpu_utilization)


@pytest.mark.parametrize("scheme", ["dp", "gossip"])
def test_cpu_hosts_count_a_collectives_bytes_once_in_either_fidelity(scheme):
    # On CPU hosts a collective runs as messages in the analytic fidelity too, so its
    # bytes are the messages' alone: the same as the detailed model's.
    detailed = run(preset(), 4, scheme, fidelity="detailed")
    analytic = run(preset(), 4, scheme, fidelity="analytic")
    assert analytic.comm_bytes_total == detailed.comm_bytes_total > 0


def test_gloo_segments_follow_its_rule():
    g = GlooSpec()
    assert g.segments(100, 4) == 8  # at least two per rank
    assert g.segments(10 << 20, 2) == 10  # 10 MiB in 1 MiB segments, a multiple of 2
    assert g.segments(10 << 20, 3) == 12  # rounded up to a multiple of 3
    assert g.segments(100, 1) == 1


def test_two_buckets_in_flight_reduce_faster_than_one():
    """gloo's two threads: with per-message costs two buckets at once beat one stream."""
    p1 = preset(cores=4, message_cpu_s=2e-4)
    p1["gloo"] = {"segment_bytes": "1MiB", "threads": 1}
    p2 = copy.deepcopy(p1)
    p2["gloo"]["threads"] = 2
    tr = trace(n_layers=8, param_bytes=3 * MB, fwd_s=1e-4)
    opts = {"options": None}
    one = run(p1, 2, trace=tr, **opts).iteration_time_s
    two = run(p2, 2, trace=tr, **opts).iteration_time_s
    assert two <= one


def test_sender_handshake_serialises_point_to_point_messages():
    """Each parameter-server message holds its sender for the handshake: a bigger handshake
    is never faster. Pipeline and gossip messages (receives posted ahead, no sender
    thread) do not wait."""
    times = []
    for h in (0.0, 1e-3, 5e-3):
        times.append(run(preset(cores=4, p2p_handshake_s=h), 2, "ps").iteration_time_s)
    assert times == sorted(times) and times[2] > times[0]
    for scheme in ("gpipe", "gossip"):
        posted = {
            run(preset(cores=4, p2p_handshake_s=h), 2, scheme).iteration_time_s for h in (0, 5e-3)
        }
        assert len(posted) == 1, scheme


@pytest.mark.parametrize(
    "key, charges",
    [("p2p_message_cpu_s", (0.0, 1e-3, 3e-3)), ("p2p_copy_cpu_s_per_byte", (0.0, 1e-9, 5e-9))],
)
def test_a_messenger_message_costs_both_ends_its_own_cpu(key, charges):
    """``p2p_message_cpu_s`` per message and ``p2p_copy_cpu_s_per_byte`` per byte
    (``HostSpec.p2p_cpu``) are CPU work at both ends of every parameter-server message:
    on one core a charge makes the iteration slower (compute waits behind it), more is
    never faster, and the messages' bytes do not change; pipeline and gossip messages (no
    messenger threads) are not charged."""
    from simcore.topology import HostSpec

    assert HostSpec(p2p_message_cpu_s=1e-4, p2p_copy_cpu_s_per_byte=1e-9).p2p_cpu(
        10**6
    ) == pytest.approx(1.1e-3)
    times, sent = [], set()
    for c in charges:
        res = run(preset(cores=1, **{key: c}), 2, "ps")
        times.append(res.iteration_time_s)
        sent.add(res.comm_bytes_total)
    assert times == sorted(times) and times[1] > times[0]
    assert len(sent) == 1
    for scheme in ("gpipe", "gossip"):
        same = {
            run(preset(cores=1, **{key: c}), 2, scheme).iteration_time_s
            for c in (charges[0], charges[-1])
        }
        assert len(same) == 1, scheme


def test_a_messenger_message_costs_its_busy_cpu_only_where_compute_takes_every_core():
    """``p2p_message_busy_cpu_s`` replaces ``p2p_message_cpu_s`` at an end whose cores
    all compute when the message starts: with one core per rank (two ranks computing on
    two cores) a higher busy cost makes the parameter server slower and never faster;
    with a core more than the ranks compute on, it is never charged; 0 means the idle
    cost at any load; the bytes never change."""
    from simcore.topology import HostSpec

    spec = HostSpec(p2p_message_cpu_s=1e-4, p2p_message_busy_cpu_s=5e-4)
    assert spec.p2p_cpu(0) == pytest.approx(1e-4)
    assert spec.p2p_cpu(0, busy=True) == pytest.approx(5e-4)
    assert HostSpec(p2p_message_cpu_s=1e-4).p2p_cpu(0, busy=True) == pytest.approx(1e-4)
    tr = trace(n_layers=4, param_bytes=MB, fwd_s=5e-3)
    times, sent = [], set()
    for busy in (0.0, 1e-4, 2e-3, 8e-3):
        res = run(preset(cores=2, p2p_message_cpu_s=1e-4, p2p_message_busy_cpu_s=busy), 2,
                  "ps", trace=tr)  # fmt: skip
        times.append(res.iteration_time_s)
        sent.add(res.comm_bytes_total)
    assert times[0] == pytest.approx(times[1])  # 0: the idle cost, which 1e-4 is
    assert times == sorted(times) and times[3] > times[1]
    assert len(sent) == 1
    spare = {
        run(preset(cores=8, p2p_message_cpu_s=1e-4, p2p_message_busy_cpu_s=b), 2, "ps",
            trace=tr).iteration_time_s
        for b in (0.0, 8e-3)
    }  # fmt: skip
    assert len(spare) == 1


@pytest.mark.parametrize("wakeup_s", [0.5e-3, 2e-3])
def test_a_woken_thread_waits_for_a_core_only_while_compute_takes_all(wakeup_s):
    """``host.wakeup_s`` with free communication CPU: a two-rank ring all-reduce has two
    steps, each a message that leaves and arrives while compute takes both cores, so it
    takes exactly four waits longer than with idle cores, each ``wakeup_s`` times the
    computing threads per core; one computing thread leaves a core free and costs
    nothing (links without tbf's bucket, which would refill while a message waits)."""
    from realrun.calibration.simfits import simulate_busy_allreduce

    p = preset(cores=2)
    p["network"] = {k: v for k, v in p["network"].items() if k not in SHAPING}
    base = simulate_busy_allreduce(p, 4 * MB, 0, 0.0)
    for threads in (0, 1, 2, 3, 4):
        # no CPU costs: compute alone changes nothing
        assert simulate_busy_allreduce(p, 4 * MB, threads, 0.0) == pytest.approx(base)
        waits = 4 * wakeup_s * threads / 2 if threads >= 2 else 0.0
        got = simulate_busy_allreduce(p, 4 * MB, threads, wakeup_s)
        assert got == pytest.approx(base + waits)


@pytest.mark.parametrize(("scheme", "cores", "gpus"), [("dp", 1, 2), ("dp", 2, 3), ("gpipe", 2, 4)])
def test_waking_up_slows_synchronous_schemes_and_moves_no_bytes(scheme, cores, gpus):
    """With buckets that all-reduce while the ranks still compute (dp, 20 MB layers) and
    a pipeline whose stages share the cores (gpipe), a longer wake-up wait is never
    faster, and the bytes stay the same. (Where ranks do not wait for each other every
    iteration, ``ps`` and the asynchronous pipelines, a later message can let another
    rank's compute have the cores first and come out faster: processor sharing's
    scheduling anomalies.)"""
    kw = {"trace": trace(param_bytes=20 * MB)} if scheme == "dp" else {}
    times, sent = [], set()
    for w in (0.0, 1e-3, 4e-3):
        res = run(preset(cores=cores, wakeup_s=w), gpus, scheme, **kw)
        times.append(res.iteration_time_s)
        sent.add(res.comm_bytes_total)
    assert times == sorted(times) and times[2] > times[0]
    assert len(sent) == 1


def test_a_send_returns_once_the_socket_buffer_holds_the_rest():
    """A parameter server's sender moves on when what is left of a message fits in the send
    buffer, so pushes to different servers overlap: faster than a sender held until each
    message arrives (not monotone in the buffer's size: an earlier start can delay what
    it then shares a link with), bytes unchanged; a buffer larger than every message
    acts as an unbounded one."""
    base = {"p2p_handshake_s": 1e-4, "copy_cpu_s_per_byte": 1e-10}
    held = run(preset(cores=4, **base), 3, "ps")
    for size in (4096, 1 << 20):
        r = run(preset(cores=4, socket_buffer=size, **base), 3, "ps")
        assert r.iteration_time_s < held.iteration_time_s
        assert r.comm_bytes_by_link == held.comm_bytes_by_link
    huge = run(preset(cores=4, socket_buffer=1 << 40, **base), 3, "ps")
    assert (
        huge.iteration_time_s
        == run(preset(cores=4, socket_buffer=1 << 30, **base), 3, "ps").iteration_time_s
    )


@settings(max_examples=25, deadline=None)
@given(
    cores=st.integers(1, 4),
    scheme=st.sampled_from(["dp", "ps", "p3", "gossip", "gpipe", "pipedream", "spectrain"]),
    copy_ns=st.floats(0.0, 5.0),
    balance_s=st.sampled_from([0.0, 5e-3]),
)
def test_more_cores_are_never_slower_and_bytes_balance(cores, scheme, copy_ns, balance_s):
    host = {"copy_cpu_s_per_byte": copy_ns * 1e-9, "message_cpu_s": 1e-4, "balance_s": balance_s}
    p_small = preset(cores=cores, **host)
    p_big = preset(cores=cores + 2, **host)
    a = run(p_small, 2, scheme)
    b = run(p_big, 2, scheme)
    assert b.iteration_time_s <= a.iteration_time_s * (1 + 1e-9)
    sent = sum(a.comm_bytes_by_link.values())
    received = sum(a.comm_bytes_received_by_link.values())
    assert sent == received
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in a.per_gpu_utilization)
    again = run(p_small, 2, scheme)
    assert again.iteration_time_s == a.iteration_time_s


def test_cpu_devices_are_not_called_gpus():
    topo = build_topology(TopologySpec(load_preset("netns"), 3))
    names = [topo.devices[d].name for d in topo.gpus]
    assert names == ["n0.rank0", "n1.rank0", "n2.rank0"]
    assert topo.host_spec is not None and topo.host_spec.cores == 2


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"host": None}, "needs a 'host' section"),
        ({"host": {"cores": 0}}, "host.cores"),
        ({"host": {"cores": 2, "speed": 3}}, "host.speed: unknown setting; known: cores, shared"),
        ({"host": {"cores": 2, "wakeup_s": -1e-3}}, "host.wakeup_s"),
        ({"host": {"cores": 2, "isend_s": -1e-3}}, "host.isend_s"),
        ({"host": {"cores": 2, "posted_cpu_s": -1e-3}}, "host.posted_cpu_s"),
        ({"host": {"cores": 2, "balance_s": -1e-3}}, "host.balance_s"),
        ({"host": {"cores": 2, "link_cpu_s_per_byte": -1e-9}}, "host.link_cpu_s_per_byte"),
        ({"gpu": {"kind": "tpu"}}, "gpu.kind: 'tpu' is not allowed; choose one of: gpu, cpu"),
    ],
)
def test_bad_host_sections_are_named(change, needle):
    p = copy.deepcopy(load_preset("netns"))
    for k, v in change.items():
        if v is None:
            p.pop(k)
        elif k == "gpu":
            p["gpu"] = {**p["gpu"], **v}
        else:
            p[k] = v
    with pytest.raises(TopologyError, match=needle):
        build_topology(TopologySpec(p, 2))


@pytest.mark.parametrize("scheme", ["dp", "gpipe"])
def test_an_optimizer_steps_fixed_overhead_adds_once_per_step(scheme):
    """``gpu.step_overhead_s`` is paid by every optimizer step whatever its bytes: one rank
    alone (nothing shares its cores, dp's single rank has no messages) takes it once more
    per iteration, and so does a GPipe flush (its stages step in parallel, stage 0 last,
    on cores of their own)."""
    base = preset(cores=4)
    slow = copy.deepcopy(base)
    slow["gpu"]["step_overhead_s"] = "5ms"
    gpus = 1 if scheme == "dp" else 2
    a = run(base, gpus, scheme).iteration_time_s
    b = run(slow, gpus, scheme).iteration_time_s
    assert b - a == pytest.approx(5e-3)


def test_a_weight_predictions_fixed_overhead_adds_to_every_prediction():
    """``gpu.predict_overhead_s`` is paid by every SpecTrain prediction whatever its bytes:
    on cores of their own, each prediction span is that much longer."""
    from simcore.records import PREDICT

    base = preset(cores=4)
    slow = copy.deepcopy(base)
    slow["gpu"]["predict_overhead_s"] = "5ms"

    def predictions(p: dict) -> list[float]:
        res = run(p, 2, "spectrain", record_spans=True)
        return [s[5] - s[4] for s in res.spans if s[2] == PREDICT]  # Span field order

    a, b = predictions(base), predictions(slow)
    assert a and len(a) == len(b)
    assert [y - x for x, y in zip(a, b, strict=True)] == pytest.approx([5e-3] * len(a))


def four_hosts_sending(
    buffer_bytes: int, sends: list[tuple[str, int, int]]
) -> tuple[dict[str, float], object, list[int]]:
    """Four CPU hosts on the netns preset (4 cores, a 1 us handshake, ``buffer_bytes`` of
    send buffer, no lead on the links): ranks 2 and 3 each send 8 MiB to rank 1, then
    rank 0 sends ``sends`` (``(tag, destination rank, bytes)``, in order) through its
    sender. Returns when each tag arrived, the network and the ranks' devices."""
    from simcore.engine import cpu_pools
    from simcore.network import DetailedNetwork

    p = preset(cores=4, p2p_handshake_s=1e-6, socket_buffer=buffer_bytes)
    # flows take turns from their first chunk: which of three flows starting together
    # would lead the others is not what these tests are about
    p = {**p, "network": {**p["network"], "lead_s": 0}}
    topo = build_topology(TopologySpec(p, 4))
    env = Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=64 << 10)
    transport = HostTransport(net, CommCpu(topo.host_spec, cpu_pools(env, topo)))
    arrived: dict[str, float] = {}
    g = topo.gpus

    def send(src, dst, nbytes, tag):
        transport.send(
            g[src], g[dst], nbytes, lambda m: arrived.setdefault(m.tag, env.now), tag=tag
        )

    for other in (2, 3):
        send(other, 1, 8 << 20, f"bulk{other}")
    for tag, dst, nbytes in sends:
        send(0, dst, nbytes, tag)
    env.run()
    return arrived, transport, g


@pytest.mark.parametrize("buffer_bytes", [1 << 20, 8 << 20])
def test_a_send_waits_while_its_peer_connection_holds_a_full_buffer(buffer_bytes):
    """The send buffer is per connection: rank 0 sends two 1 MiB messages to rank 1, whose
    link two other ranks keep busy, then a small one to idle rank 2. With a 1 MiB buffer the
    second message to rank 1 returns only once the first has arrived (what is in flight to
    rank 1 must fit in the buffer), so the small message leaves after that; with 8 MiB all
    three are handed over at once and the small one arrives long before rank 1's first."""
    arrived, transport, g = four_hosts_sending(
        buffer_bytes, [("first", 1, 1 << 20), ("second", 1, 1 << 20), ("small", 2, 1024)]
    )
    rate = 1.0 / max(st.service for st in transport.net.hops(g[0], g[1]))
    if buffer_bytes == 1 << 20:
        assert arrived["small"] > arrived["first"]
    else:
        assert arrived["small"] < 2.5 * (1 << 20) / rate < arrived["first"]
    sockets = transport._senders[g[0]].sockets
    assert sockets[g[1]].queued == sockets[g[1]].acked == 2 << 20


@pytest.mark.parametrize("headers_ahead", [1, 1 << 30])
def test_a_message_waits_for_its_peer_to_post_its_header(monkeypatch, headers_ahead):
    """A messenger's receiving thread keeps one header receive posted beyond the message
    it handles, so the third message to a peer waits until the peer is done with the
    first, whatever the socket buffer: rank 0 sends two 1 MiB messages to rank 1 (whose
    link two other ranks keep busy) and a 64-byte one, then 1 KiB to idle rank 2. The
    64-byte one, and the message to rank 2 queued behind it, arrive only after rank 1's
    first; with unlimited headers posted (the model without the rule) rank 2's comes long
    before."""
    from simcore.transport import _Sender

    monkeypatch.setattr(_Sender, "HEADERS_AHEAD", headers_ahead)
    arrived, transport, g = four_hosts_sending(
        8 << 20,
        [("first", 1, 1 << 20), ("second", 1, 1 << 20), ("ctrl", 1, 64), ("small", 2, 1024)],
    )
    if headers_ahead == 1:
        assert arrived["first"] < arrived["ctrl"] and arrived["first"] < arrived["small"]
    else:
        assert arrived["small"] < 0.5 * arrived["first"]
    sockets = transport._senders[g[0]].sockets
    assert sockets[g[1]].sent == sockets[g[1]].delivered == 3


@pytest.mark.parametrize("scheme", ["ps", "p3"])
def test_a_servers_shard_update_is_a_step_with_its_fixed_overhead(scheme):
    """On CPU hosts a parameter server updates each shard as an optimizer step:
    ``gpu.step_overhead_s`` makes every server update span that much longer (cores of
    their own, so nothing else stretches them)."""
    from simcore.records import UPDATE

    base = preset(cores=16)
    slow = copy.deepcopy(base)
    slow["gpu"]["step_overhead_s"] = "2ms"

    def updates(p: dict) -> list[float]:
        res = run(p, 2, scheme, record_spans=True)
        return [s[5] - s[4] for s in res.spans if s[2] == UPDATE and "/ps" in s[0]]

    a, b = updates(base), updates(slow)
    assert a and len(a) == len(b)
    assert [y - x for x, y in zip(a, b, strict=True)] == pytest.approx([2e-3] * len(a))


@pytest.mark.parametrize("hold_s", [0.0, 0.05])
def test_a_receiving_thread_still_at_work_holds_the_senders_next_messages(hold_s):
    """A message whose receiving thread goes on working on it (``Message.hold``: a
    server's update runs on the thread that took the last push) keeps that thread from
    the sender's next messages until the work is done: rank 0 sends three 1 KiB messages
    to rank 1, and the thread keeps the first for ``hold_s``. The second and third are
    handed over only after that, in order (their bytes had long arrived); the sender's
    socket counts all three taken in the end."""
    from simcore.engine import cpu_pools
    from simcore.network import DetailedNetwork

    topo = build_topology(TopologySpec(preset(cores=4, p2p_handshake_s=1e-6), 2))
    env = Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=64 << 10)
    transport = HostTransport(net, CommCpu(topo.host_spec, cpu_pools(env, topo)))
    handed: list[tuple[str, float]] = []

    def keep(release) -> None:
        env.timeout(hold_s).callbacks.append(lambda _e: release())

    def on_arrival(m) -> None:
        handed.append((m.tag, env.now))
        if m.tag == "first" and hold_s:
            m.hold = keep

    for tag in ("first", "second", "third"):
        transport.send(topo.gpus[0], topo.gpus[1], 1024, on_arrival, tag=tag)
    env.run()
    assert [tag for tag, _t in handed] == ["first", "second", "third"]
    first = handed[0][1]
    if hold_s:
        assert all(t >= first + hold_s for _tag, t in handed[1:])
    else:
        assert all(t < first + 0.01 for _tag, t in handed[1:])
    sock = transport._senders[topo.gpus[0]].sockets[topo.gpus[1]]
    assert sock.sent == sock.delivered == 3 and not sock.backlog


# ---- a shaped link's packet work (host.link_cpu_s_per_byte) --------------------------------
@pytest.mark.parametrize("balance_s", [0.0, 5e-3])
def test_the_links_packet_work_slows_compute_and_nobody_waits_for_it(balance_s):
    """One core computing 1 s; 100 MB held by a link at 1 ns per byte and end, both ends on
    this machine: 0.2 s of work that shares the core, so the compute ends at 1.2 s, and the
    call returns at once (no thread waits for it)."""
    from simcore.topology import HostSpec

    env = Environment()
    pool = CpuPool(env, 1, balance_s)
    ends = []
    pool.run(1.0, lambda: ends.append(env.now), holds=True, thread="rank")
    CommCpu(HostSpec(cores=1, link_cpu_s_per_byte=1e-9), lambda _d: pool).background(0, 1, 100 * MB)
    env.run()
    assert ends == [pytest.approx(1.2)]
    assert pool.busy_s == pytest.approx(1.2)


def test_the_links_packet_work_costs_nothing_when_not_set():
    from simcore.topology import HostSpec

    env = Environment()
    pool = CpuPool(env, 1)
    CommCpu(HostSpec(cores=1), lambda _d: pool).background(0, 1, 100 * MB)
    env.run()
    assert pool.busy_s == 0.0


def test_link_cpu_makes_a_link_bound_exchange_cost_cpu_but_not_time():
    """gossip on two hosts of the netns preset: the packet work adds busy core time in
    proportion to it, and the iteration (link-bound, cores to spare) barely moves."""
    base = run(preset(2), 2, "gossip", trace=trace(param_bytes=4 * MB))
    more = run(preset(2, link_cpu_s_per_byte=2e-9), 2, "gossip", trace=trace(param_bytes=4 * MB))
    assert more.iteration_time_s == pytest.approx(base.iteration_time_s, rel=0.05)
    assert more.iteration_time_s >= base.iteration_time_s * (1 - 1e-9)


# ---- sends a rank's own thread writes (isend) ---------------------------------------------
def _isend(
    on_thread: bool, busy: int, isend_s: float = 0.0, cores: int = 2, posted_cpu_s: float = 0.0
) -> tuple[float, float, float, float]:
    """Two CPU hosts on ``cores`` shared cores (2 us per message and 1 ns per byte each end, a 3 ms
    wake-up): ``busy`` threads compute throughout, then rank 0 sends 1 MB to rank 1
    (``on_thread``: from its own thread, as a pipeline's ``isend``) and queues 1 ms of
    compute on its thread right after. Returns when the message left, when it arrived,
    when that compute ended, and the core-seconds of work the machines did."""
    from simcore.engine import cpu_pools
    from simcore.network import DetailedNetwork

    p = preset(cores=cores, message_cpu_s=2e-6, copy_cpu_s_per_byte=1e-9, wakeup_s=3e-3,
               isend_s=isend_s, posted_cpu_s=posted_cpu_s)  # fmt: skip
    p["network"] = {k: v for k, v in p["network"].items() if k not in SHAPING}
    topo = build_topology(TopologySpec(p, 2))
    env = Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=64 << 10)
    pool_of = cpu_pools(env, topo)
    g = topo.gpus
    rank0 = CpuStream(pool_of(g[0]))
    transport = HostTransport(net, CommCpu(topo.host_spec, pool_of, {g[0]: rank0}))
    for _ in range(busy):
        pool_of(g[0]).run(1.0, lambda: None, holds=True)
    got: dict[str, float] = {}
    send = transport.isend_on_thread if on_thread else transport.isend
    msg = send(g[0], g[1], MB, lambda m: got.setdefault("arrived", env.now))
    rank0.submit(1e-3, ("forward", "next", 0, 0, -1), lambda end: got.setdefault("next", end))
    env.run(until=0.5)
    busy = sum(pool.busy_s for pool in {id(pool_of(d)): pool_of(d) for d in g[:2]}.values())
    return msg.start_s, got["arrived"], got["next"], busy


@pytest.mark.parametrize("isend_s", [0.0, 2e-4])
def test_a_send_the_ranks_own_thread_writes_holds_it_for_the_messages_cpu(isend_s):
    """A pipeline's message is written by the stage's thread inside ``isend``: the
    sending end's CPU (``message_cpu``: 2 us + 1 ms for 1 MB) and ``host.isend_s`` hold
    that thread, so its next compute starts only after them (exactly, with a core for
    every thread), while the bytes leave at once; handed to a communication thread
    instead, the next compute runs alongside. The message arrives no earlier either way
    (its delivery waits for the sending end's CPU both ways)."""
    hold = 2e-6 + MB * 1e-9 + isend_s
    start, arrived, after, _busy = _isend(True, 0, isend_s, cores=3)
    assert start == 0.0 and after == pytest.approx(hold + 1e-3)
    assert arrived >= hold
    start, arrived_pool, after, _busy = _isend(False, 0, isend_s, cores=3)
    assert start == 0.0 and after == pytest.approx(1e-3)
    assert arrived_pool == pytest.approx(arrived) or arrived_pool < arrived


def test_a_send_the_ranks_own_thread_writes_does_not_wait_to_wake_up():
    """With compute on both cores a message handed to a communication thread leaves only
    after the wake-up wait (``wakeup_s`` x 2 computing threads / 2 cores = 3 ms, rank 0's
    thread included once it computes); the running rank's own thread writes at once."""
    start, *_rest = _isend(True, 2)
    assert start == 0.0
    start, *_rest = _isend(False, 2)
    assert start == pytest.approx(3e-3)


def test_the_transport_threads_cpu_of_a_posted_send_takes_cores_and_holds_no_one():
    """``host.posted_cpu_s`` (a pipeline's gloo threads beyond the calibrated copies) is
    work on both ends' cores that nobody waits for: with a core for every thread the
    message leaves, arrives and the rank's next compute ends when they did without it,
    and the cores did exactly twice that much more work (the two ends share a machine
    here); a message a communication thread writes (not posted) costs none of it. On a
    machine whose cores are full it slows a pipeline down, never speeds it up."""
    *times, busy = _isend(True, 0, cores=4)
    *times_posted, busy_posted = _isend(True, 0, cores=4, posted_cpu_s=4e-4)
    assert times_posted == times
    assert busy_posted - busy == pytest.approx(2 * 4e-4)
    assert _isend(False, 0, cores=4, posted_cpu_s=4e-4) == _isend(False, 0, cores=4)
    base = preset(cores=1)
    slow = dict(base, host={**base["host"], "posted_cpu_s": 2e-3})
    assert run(slow, 2, "pipedream").iteration_time_s > run(base, 2, "pipedream").iteration_time_s


# ---- compute jitter on CPU hosts -------------------------------------------------------
@pytest.mark.parametrize("scheme, n", [("dp", 3), ("gpipe", 3), ("ps", 2)])
def test_jitter_on_cpu_hosts_is_seeded_and_moves_no_bytes(scheme, n):
    """``compute_jitter`` varies a CPU rank's ops as it does a GPU's: the same seed gives
    the same run, another seed another time, the bytes stay as they are, and a rank's
    compute (one rank per core, nothing else on the cores) is the trace's work times the
    factors drawn, whose mean is 1: close to the deterministic run's."""
    p = preset(cores=8)
    base = run(p, n, scheme)
    a = run(p, n, scheme, compute_jitter=0.2, seed=1)
    b = run(p, n, scheme, compute_jitter=0.2, seed=1)
    c = run(p, n, scheme, compute_jitter=0.2, seed=2)
    assert a.iteration_time_s == b.iteration_time_s
    assert a.iteration_time_s != c.iteration_time_s
    assert a.comm_bytes_per_iteration == base.comm_bytes_per_iteration
    mean = sum(run(p, n, scheme, compute_jitter=0.2, seed=s).iteration_time_s for s in range(8)) / 8
    assert mean == pytest.approx(base.iteration_time_s, rel=0.1)


def test_jitter_multiplies_each_ops_cpu_work_by_its_factor():
    """One rank on its own core, compute only: the recorded spans are the trace's layer
    times times the factors of :class:`simcore.device.LogNormalFactors` drawn from the
    rank's seed, in order."""
    import numpy as np

    from simcore.device import LogNormalFactors

    tr = trace(n_layers=3, param_bytes=4)
    p = preset(cores=2)
    r = run(p, 1, "dp", trace=tr, iterations=1, warmup_iterations=0, compute_jitter=0.3,
            seed=5, record_spans=True)  # fmt: skip
    (child,) = np.random.default_rng(5).spawn(1)
    draw = LogNormalFactors(child, 0.3)
    # spans: (device, "compute", kind, layer name, start_s, end_s, ...), in order
    layers = [s for s in r.spans if s[1] == "compute" and s[3].startswith("l")]
    expected = [0.01 * draw() for _ in range(3)] + [0.02 * draw() for _ in range(3)]
    assert [s[2] for s in layers] == ["forward"] * 3 + ["backward"] * 3
    assert [s[5] - s[4] for s in layers] == pytest.approx(expected, rel=1e-9)
