"""``simulate(config) -> RunResult``: the simulator's one entry point."""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from operator import attrgetter
from typing import Any

from simpy import Environment
from simpy.core import EmptySchedule

import simcore.metrics as metrics
from simcore.clock import run_to_end, scheduled_events
from simcore.collectives import Collectives
from simcore.config import ConfigError, SimConfig
from simcore.device import Gpu, JitteryGpu, LogNormalFactors
from simcore.host import CpuPool, CpuRank
from simcore.network import make_network, uplink_factors
from simcore.records import COMM, RECV, SEND, LinkRecord, RunRecords, compute_span
from simcore.result import RunResult, _frozen
from simcore.schemes import get_scheme
from simcore.schemes.base import SimContext
from simcore.topology import Topology, build_topology
from simcore.transport import CommCpu, HostTransport, Transport


class SimulationError(RuntimeError):
    """The simulation could not complete (a scheme stalled before its last iteration)."""


def resolve_topology(config: SimConfig, dedicated_servers: int) -> Topology:
    """The concrete topology of ``config``, with the parameter-server hosts a scheme asks
    for added to a preset's fabric."""
    topo = config.topology
    if isinstance(topo, Topology):
        return topo
    if dedicated_servers != topo.dedicated_servers:
        topo = replace(topo, dedicated_servers=dedicated_servers)
    return build_topology(topo)


def simulate(config: SimConfig, progress: Callable[[float], None] | None = None) -> RunResult:
    """Run one simulation and compute its metrics.

    Deterministic: the same config (seed included) gives the same result, bit for bit.
    ``progress``, if given, is called now and then with the share of iterations done
    (0 to 1): the hook a caller draws a progress bar with.
    Raises ``ConfigError`` for configurations the scheme rejects and
    :class:`SimulationError` if the scheme stalls.
    """
    wall0 = time.perf_counter()
    with _gc_paused():
        return _simulate(config, progress, wall0)


def _simulate(
    config: SimConfig, progress: Callable[[float], None] | None, wall0: float
) -> RunResult:
    """:func:`simulate`'s work, with the garbage collector paused by the caller: when
    this returns, the run's objects are unreachable (see :func:`_gc_paused`)."""
    cls = get_scheme(config.scheme)
    options = config.options if config.options is not None else cls.Options()
    if not isinstance(options, cls.Options):
        raise ConfigError(
            "options", type(options).__name__, f"scheme {cls.name!r} takes {cls.Options.__name__}"
        )
    topology = resolve_topology(config, cls.dedicated_servers(options, config.gpus))
    cls.check(config, options, topology)

    trace = config.trace.rescale_batch(config.effective_batch_size)
    if config.compute_scale != 1.0:
        trace = trace.rescale_device(config.compute_scale)

    env = Environment()
    net = make_network(
        env,
        topology,
        config.fidelity,
        config.chunk_bytes,
        priority=cls.priority_network,
        rate_factors=uplink_factors(topology, config.seed),
    )
    compute_log: list[tuple[Any, ...]] = []
    gpu_log = compute_log if config.record_spans else None
    rng = None
    names = [topology.devices[d].name for d in topology.gpus]
    n = topology.num_gpus
    factors: list[LogNormalFactors | None] = [None] * n
    if config.compute_jitter > 0:
        import numpy as np  # only runs with randomness pay for the import

        rng = np.random.default_rng(config.seed)
        factors = [LogNormalFactors(g, config.compute_jitter) for g in rng.spawn(n)]
    ranks = list(zip(enumerate(topology.gpus), factors, strict=True))
    pool_of = None
    transport: Transport
    gpus: list[Gpu]
    if topology.host_spec is None or topology.gpu_spec.kind != "cpu":
        gpus = [
            Gpu(env, r, d, names[r], gpu_log)
            if f is None
            else JitteryGpu(env, r, d, names[r], gpu_log, f)
            for (r, d), f in ranks
        ]
    if topology.host_spec is not None:
        # CPU hosts: communication's CPU work on the machines' cores; the ranks compute
        # there too, unless their compute is on a device (an emulated GPU host)
        pool_of = cpu_pools(env, topology)
        threads = None
        if topology.gpu_spec.kind == "cpu":
            gpus = [CpuRank(env, r, d, names[r], gpu_log, pool_of(d), f) for (r, d), f in ranks]
            threads = {g.device: g.stream for g in gpus}
        transport = HostTransport(net, CommCpu(topology.host_spec, pool_of, threads))
    else:
        transport = Transport(net)  # GPUs: messages cost the hosts nothing
    coll = Collectives(net, transport)
    ctx = SimContext(env, config, options, trace, topology, net, coll, gpus, compute_log, rng)
    ctx.cpu_pool_of = pool_of
    scheme = cls(ctx)
    scheme.start()
    _run(env, None if progress is None else lambda: progress(_share_done(ctx.iteration_end)))
    events = scheduled_events(env)
    scheme.finish()
    for it, row in enumerate(ctx.iteration_end):
        for r, t in enumerate(row):
            if t < 0:
                raise SimulationError(
                    f"scheme {cls.name!r} stalled: rank {r} never finished iteration "
                    f"{it} (simulated time {env.now:.6g} s)"
                )
    result = _result(config, cls.name, scheme, ctx, topology, trace, events, wall0)
    # The messages are most of the run's objects; they sit in reference cycles (their
    # callbacks hold the scheme, which holds the network that lists them), so released
    # here they are freed at once instead of by a collection that walks them all.
    ctx.net.messages.clear()
    return result


def cpu_pools(env: Environment, topology: Topology) -> Callable[[int], CpuPool]:
    """The machines of a cluster of CPU hosts: one :class:`CpuPool` for all devices when
    the host is shared (the emulated cluster), else one per box and one per device
    outside the boxes (dedicated server hosts, switches)."""
    spec = topology.host_spec
    assert spec is not None
    if spec.shared:
        pool = CpuPool(env, spec.cores, spec.balance_s)
        return lambda _device: pool
    pools: dict[int, CpuPool] = {}
    devices = topology.devices

    def pool_of(device: int) -> CpuPool:
        box = devices[device].box
        key = box if box >= 0 else -1 - device
        if key not in pools:
            pools[key] = CpuPool(env, spec.cores, spec.balance_s)
        return pools[key]

    return pool_of


PROGRESS_EVERY = 50_000
"""Scheduler events between two progress reports."""


def _share_done(iteration_end: list[list[float]]) -> float:
    """Share of iterations that the first and the last rank have finished."""
    done = sum(1 for row in iteration_end if row[0] >= 0 and row[-1] >= 0)
    return done / len(iteration_end) if iteration_end else 1.0


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a whole simulation, set-up, run and
    metrics: a large simulation keeps millions of objects alive, and every collection
    would walk all those made since the last one, only to find them alive. The
    collector resumes once :func:`_simulate` has returned, when the run's objects are
    unreachable: the first collection then finds what cycles keep of them at once,
    instead of first promoting them all and walking them again later."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run(env: Environment, report: Callable[[], None] | None = None) -> None:
    """Run to the end; with ``report``, call it every :data:`PROGRESS_EVERY` events."""
    if report is None:
        run_to_end(env)
        return
    step = env.step
    try:
        while True:
            for _ in range(PROGRESS_EVERY):
                step()
            report()
    except EmptySchedule:
        report()


_NBYTES = attrgetter("nbytes")
_ITERATION = attrgetter("iteration")
_HOPS = attrgetter("hops")


def collect_records(ctx: SimContext) -> RunRecords:
    """The records of a finished run that the metrics are computed from (see
    :class:`~simcore.records.RunRecords`)."""
    chunk = getattr(ctx.net, "chunk_bytes", 0)
    messages = ctx.net.messages
    # Per message in C loops (a run has hundreds of thousands); chunk transfers from
    # the messages' distinct (hops, bytes) pairs.
    sizes = list(map(_NBYTES, messages))
    transfers = list(zip(sizes, map(_ITERATION, messages)))
    shapes = Counter(zip(map(len, map(_HOPS, messages)), sizes))
    chunks = sum(
        count * (max(1, hops * -(-nbytes // chunk)) if chunk and hops else 1)
        for (hops, nbytes), count in shapes.items()
    )
    closed_form = 0
    if ctx.coll.transport.closed_form:  # collectives that sent no messages
        for op, ranks, n, _s, _e, it, _tag in ctx.coll.records:
            if len(ranks) > 1:
                transfers.append((round(ctx.coll.payload_factor(op, ranks) * n), it))
                closed_form += 1
    return RunRecords(
        iteration_end=tuple(tuple(row) for row in ctx.iteration_end),
        busy_by_iteration=tuple(dict(g.busy_by_iteration) for g in ctx.gpus),
        ops=tuple(g.ops for g in ctx.gpus),
        links=tuple(
            LinkRecord(link.name, link.kind, sent, recv, busy)
            for link, sent, recv, busy in ctx.net.link_bytes()
        ),
        transfers=tuple(transfers),
        chunk_transfers=chunks,
        closed_form_collectives=closed_form,
        traffic_scale=ctx.traffic_scale,
        peak_memory_bytes=tuple(g.memory.peak for g in ctx.gpus),
        peak_breakdown=tuple(dict(g.memory.peak_breakdown) for g in ctx.gpus),
        end_s=ctx.env.now,
        messages=len(messages),
    )


def _result(
    config: SimConfig,
    name: str,
    scheme: Any,
    ctx: SimContext,
    topology: Topology,
    trace: Any,
    events: int,
    wall0: float,
) -> RunResult:
    rec = collect_records(ctx)
    warmup, iterations = config.warmup_iterations, config.iterations
    first, last = warmup, config.total_iterations - 1
    iter_s = metrics.steady_iteration_time(rec.iteration_end, warmup)
    busy = [metrics.busy_between(b, first, last) for b in rec.busy_by_iteration]
    util = metrics.utilization(busy, iter_s * iterations)
    gpu_util = sum(util) / len(util)
    replicas = scheme.replicas()
    batch = config.effective_batch_size
    global_batch = batch * replicas
    single = replicas * trace.compute_s + ctx.update_s(trace.param_bytes)
    total, measured = metrics.payload_bytes(rec.transfers, first, last, rec.traffic_scale)
    peaks = tuple(round(p) for p in rec.peak_memory_bytes)
    worst = max(range(len(peaks)), key=peaks.__getitem__)

    spans: tuple[tuple[Any, ...], ...] = ()
    if config.record_spans:
        spans = (
            tuple(map(compute_span, ctx.compute_log))
            + tuple(ctx.spans)
            + _message_spans(ctx, topology)
            + _collective_spans(ctx)
        )
    extra = dict(scheme.extra_metrics())
    extra.update(ctx.extra)
    return RunResult(
        scheme=name,
        gpus=topology.num_gpus,
        model=trace.meta.model,
        topology=topology.name,
        fidelity=config.fidelity,
        batch_size=batch,
        global_batch_size=global_batch,
        iterations=iterations,
        warmup_iterations=warmup,
        iteration_time_s=iter_s,
        iteration_times_s=tuple(
            metrics.iteration_durations(metrics.iteration_ends(rec.iteration_end))
        ),
        throughput_samples_s=global_batch / iter_s if iter_s > 0 else float("inf"),
        single_gpu_time_s=single,
        speedup=single / iter_s if iter_s > 0 else float("inf"),
        gpu_utilization=gpu_util,
        per_gpu_utilization=tuple(util),
        bubble_fraction=max(0.0, 1.0 - gpu_util),
        comm_bytes_total=total,
        comm_bytes_measured=round(measured),
        comm_bytes_per_iteration=measured / iterations,
        simulated_iterations=ctx.simulated_iterations,
        comm_bytes_by_link_kind=_frozen(metrics.bytes_by_kind(rec.links)),
        comm_bytes_by_link=_frozen({k.name: k.sent_bytes for k in rec.links if k.sent_bytes}),
        comm_bytes_received_by_link=_frozen(
            {k.name: k.received_bytes for k in rec.links if k.received_bytes}
        ),
        link_utilization=_frozen(metrics.link_utilization(rec.links, rec.end_s)),
        peak_memory_bytes=peaks[worst],
        per_gpu_peak_memory_bytes=peaks,
        memory_breakdown_bytes=_frozen({k: round(v) for k, v in rec.peak_breakdown[worst].items()}),
        memory_capacity_bytes=topology.gpu_spec.memory_bytes,
        events=events,
        model_events=metrics.model_events(rec),
        wall_s=time.perf_counter() - wall0,
        simulated_s=rec.end_s,
        messages=rec.messages,
        gpu_model=topology.gpu_spec.model,
        device_kind=topology.gpu_spec.kind,
        trace_device=config.trace.meta.measured_on,
        compute_scale=config.compute_scale,
        device_names=tuple(g.name for g in ctx.gpus),
        spans=spans,
        extra=_frozen(extra),
    )


def _message_spans(ctx: SimContext, topology: Topology) -> tuple[tuple[Any, ...], ...]:
    devs = topology.devices
    out = []
    for m in ctx.net.messages:
        src, dst = devs[m.src].name, devs[m.dst].name
        out.append(
            (src, SEND, "send", m.tag, m.start_s, m.end_s, m.iteration, -1, -1, m.nbytes, m.id)
        )
        out.append(
            (dst, RECV, "recv", m.tag, m.start_s, m.end_s, m.iteration, -1, -1, m.nbytes, m.id)
        )
    return tuple(out)


def _collective_spans(ctx: SimContext) -> tuple[tuple[Any, ...], ...]:
    names = [g.name for g in ctx.gpus]
    out = []
    for op, ranks, n, start, end, it, tag in ctx.coll.records:
        for r in ranks:
            out.append((names[r], COMM, op, tag, start, end, it, -1, -1, n, -1))
    return tuple(out)
