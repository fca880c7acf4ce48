"""The measured result of a real run, from the ranks' records (``records.json``), with the
same keys as ``sim run --json``. Pure functions; no torch.

* ``iteration_time_s``: the steady-state iteration time of :mod:`simcore.metrics`, over the
  workers' iteration ends (a worker's iteration ends when its backward is done and every
  value or gradient it waits for from that iteration has arrived).
* ``gpu_utilization``: per worker, the busy compute (forward, backward, update spans) of
  the measured iterations over their length; ``bubble_fraction`` is one minus the mean.
* ``comm_bytes_*``: application bytes counted by the sender (payload tensors; a control
  message counts its 64 bytes; an all-reduce counts the ring's ``2 (p-1)/p`` of the bucket
  per rank). ``comm_bytes_total``, ``comm_bytes_by_link`` and ``comm_bytes_by_link_kind``
  cover every iteration, warm-up included, as the simulator's link counters do;
  ``comm_bytes_per_iteration`` covers the measured ones. Message headers are counted apart
  (``header_bytes_per_iteration``). Bytes
  between hosts cross the sender's link to the switch and the switch's link to the
  receiver (``n<h>->switch``, ``switch->n<h>``, kind ``ethernet``); bytes between two ranks
  of one host stay on it (kind ``loopback``).
* ``single_gpu_time_s``: one rank doing the whole global batch, estimated from the measured
  compute: ``workers x (forward + backward) + update`` per iteration; ``speedup`` is that
  over ``iteration_time_s``.
* ``peak_memory_bytes``: the largest worker's peak resident memory (CPU) or peak CUDA
  allocation (GPU).
* ``send_hold_s``: the most any worker's main thread spent per measured iteration handing
  messages to gloo (:func:`send_hold_s`; 0 where a messenger thread sends).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from realrun.machine import busy_share
from simcore import metrics
from simcore.records import BACKWARD, COMPUTE, FORWARD, PREDICT, RECV, SEND, UPDATE
from simcore.schemes import get_scheme
from traces.emulated import is_emulated_ref, parse_ref
from traces.model import Trace

BUSY = (FORWARD, BACKWARD, UPDATE, "aggregate")


def summarize(
    records: Mapping[str, Any],
    *,
    wall_s: float = 0.0,
    cluster: str = "local",
    link_counters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result dictionary of a real run (see module docs)."""
    job = records["job"]
    ranks = sorted(records["ranks"], key=lambda r: r["rank"])
    workers = [r for r in ranks if r["role"] == "worker"]
    servers = [r for r in ranks if r["role"] == "server"]
    w = len(workers)
    warm, iters = int(job["warmup_iterations"]), int(job["iterations"])
    total_its = warm + iters
    first, last = warm, total_its - 1
    ends = [[float(r["iteration_end"].get(str(i), 0.0)) for r in workers] for i in range(total_its)]
    iter_s = metrics.steady_iteration_time(ends, warm)
    measured_s = iter_s * iters

    busy = []
    fb_s, upd_s = [], []
    for r in workers:
        b = fb = up = 0.0
        for s in r["spans"]:
            if s[1] == COMPUTE and s[2] in BUSY and first <= s[6] <= last:
                d = s[5] - s[4]
                b += d
                if s[2] in (FORWARD, BACKWARD):
                    fb += d
                else:
                    up += d
        busy.append(b)
        fb_s.append(fb / iters)
        upd_s.append(up / iters)
    server_update = sum(
        s[5] - s[4]
        for r in servers
        for s in r["spans"]
        if s[1] == COMPUTE and s[2] == UPDATE and first <= s[6] <= last
    )
    util = metrics.utilization(busy, measured_s)
    gpu_util = sum(util) / len(util) if util else 0.0
    pipeline = bool(job.get("pipeline"))
    update_per_it = (server_update / iters) if servers else (sum(upd_s) / max(1, w))
    if pipeline:  # each rank updates its own stage: one model's update in all
        update_per_it = sum(upd_s)
    single = w * (sum(fb_s) / max(1, w)) + update_per_it

    host_of = {r["rank"]: r["host"] for r in ranks}
    total = measured = 0
    by_rank = [0.0] * len(ranks)
    by_link: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_msg_kind: dict[str, float] = {}
    for r in ranks:
        src_host = r["host"]
        for dst, it, nbytes, kind in r["sent"]:
            total += nbytes
            dst_host = host_of[dst]
            if dst_host == src_host:
                by_kind["loopback"] = by_kind.get("loopback", 0) + nbytes
            else:
                for name in (f"n{src_host}->switch", f"switch->n{dst_host}"):
                    by_link[name] = by_link.get(name, 0) + nbytes
                by_kind["ethernet"] = by_kind.get("ethernet", 0) + 2 * nbytes
            if first <= it <= last:
                measured += nbytes
                by_rank[r["rank"]] += nbytes / iters
                by_msg_kind[kind] = by_msg_kind.get(kind, 0) + nbytes / iters
    headers = sum(r["header_bytes"] for r in ranks)
    # CPU seconds each rank's process (all its threads) spent per measured iteration
    cpu_per_it = []
    for r in ranks:
        marks = r.get("cpu_at_end") or {}
        a, b = marks.get(str(first - 1)), marks.get(str(last))
        cpu_per_it.append((b - a) / iters if a is not None and b is not None else None)
    peaks = [int(r["cuda_peak_bytes"] or r["peak_rss_bytes"]) for r in workers]
    batch = int(job["batch_size"])
    samples = batch if pipeline else batch * w  # a pipeline's ranks share one batch
    out: dict[str, Any] = {
        "scheme": job["scheme"],
        "gpus": w,
        "model": job["model"],
        "topology": f"real:{cluster}",
        "cluster": cluster,
        "backend": job["backend"],
        "device_type": workers[0]["device_type"] if workers else "cpu",
        "device_model": workers[0]["device_model"] if workers else "",
        "servers": len(servers),
        "batch_size": batch,
        "global_batch_size": samples,
        "iterations": iters,
        "warmup_iterations": warm,
        "iteration_time_s": iter_s,
        "iteration_times_s": metrics.iteration_durations(metrics.iteration_ends(ends)),
        "throughput_samples_s": samples / iter_s if iter_s > 0 else float("inf"),
        "single_gpu_time_s": single,
        "speedup": single / iter_s if iter_s > 0 else float("inf"),
        "gpu_utilization": gpu_util,
        "per_gpu_utilization": util,
        "bubble_fraction": max(0.0, 1.0 - gpu_util),
        "comm_bytes_total": total,
        "comm_bytes_per_iteration": measured / iters,
        "comm_bytes_per_iteration_by_rank": by_rank,
        "comm_bytes_per_iteration_by_message": by_msg_kind,
        "header_bytes_per_iteration": headers / total_its,
        "comm_bytes_by_link_kind": by_kind,
        "comm_bytes_by_link": by_link,
        "peak_memory_bytes": max(peaks) if peaks else 0,
        "per_gpu_peak_memory_bytes": peaks,
        "cpu_s_per_iteration_by_rank": cpu_per_it,
        "send_hold_s": send_hold_s(records),
        "events": sum(len(r["spans"]) for r in ranks),
        "wall_s": wall_s,
        "device_names": [r["device"] for r in ranks],
        "torch": records.get("torch", ""),
    }
    for key in ("buckets_planned_bytes", "buckets_measured_bytes", "shuffle_label_bytes"):
        if workers and key in workers[0]:
            out[key] = workers[0][key]
    if pipeline and workers:
        for key in ("stash_peak_bytes", "activation_peak_bytes", "stage"):
            out[key] = [r.get(key, 0) for r in workers]
        plan = job["pipeline"]
        out.update(
            microbatches=plan["microbatches"],
            stage_replicas=plan["replicas"],
            partition=plan.get("partition", ""),
        )
    if workers and "placement" in workers[0]:
        out["placement"] = workers[0]["placement"]
    if link_counters:
        out.update(link_counters)
    out["machine_cpu_busy_share"] = machine_busy_share(ranks, first - 1, last)
    if is_emulated_ref(str(job["model"])):
        out.update(emulation_columns(str(job["model"]), out))
    return out


CPU_FLAG_SHARE = 0.8
"""A run on emulated devices whose machine had more than this share of its cores busy
during the measured iterations is flagged (``cpu_flagged``): its ranks' host work may
have waited for a core longer than the simulator's shared-core model (which charges the
calibrated communication CPU to the same cores) says. Chosen from the development runs
of docs/emulated_devices.md (P3 on four emulated ResNet-18 hosts predicted within 3% at
73% busy, off by 24% at 91%), before the seed matrix was run."""


def machine_busy_share(ranks: list[Mapping[str, Any]], before: int, last: int) -> float | None:
    """The share of the machine's CPU time (all cores, all processes, the kernel's packet
    work included: ``/proc/stat``) that was busy between the end of iteration ``before``
    and the end of iteration ``last``, as the first rank that recorded both saw it;
    ``None`` when none did."""
    for r in ranks:
        marks = r.get("machine_at_end") or {}
        share = busy_share(marks.get(str(before)), marks.get(str(last)))
        if share is not None:
            return share
    return None


def emulation_columns(ref: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """What a run on emulated devices adds to its result: the factors, the emulated
    cluster's iteration time and throughput (the run's divided by the dilation), and the
    CPU flag (:data:`CPU_FLAG_SHARE`)."""
    spec = parse_ref(ref)
    k = spec.dilation
    busy = result.get("machine_cpu_busy_share")
    iter_s = float(result["iteration_time_s"])
    return {
        "device_type": "emulated",
        "device_model": "emulated device",
        "emulated_trace": spec.trace,
        "dilation": k,
        "byte_scale": spec.byte_scale,
        "emulated_iteration_time_s": iter_s / k,
        "emulated_throughput_samples_s": result["global_batch_size"] / (iter_s / k)
        if iter_s > 0
        else float("inf"),
        "cpu_flagged": busy is not None and busy > CPU_FLAG_SHARE,
    }


def spans(records: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Every rank's spans (Span field order), workers first."""
    ranks = sorted(records["ranks"], key=lambda r: r["rank"])
    return [tuple(s) for r in ranks for s in r["spans"]]


def posts_sends(job: Mapping[str, Any]) -> bool:
    """Whether the ranks of ``job`` (a record's job) hand each message to gloo on their
    main thread (``isend`` through :class:`realrun.p2p.PostedLink`), so that their send
    spans are the main thread's time (the scheme class's ``posts_sends``: the pipelines
    and gossip); the parameter servers' messenger sends from a thread of its own."""
    return bool(get_scheme(job["scheme"]).posts_sends)


def send_hold_s(records: Mapping[str, Any]) -> float:
    """The most any worker's main thread spent per measured iteration handing messages to
    gloo (the sum of its send spans in the measured iterations; the simulator's sends never
    hold a rank), or 0 for a scheme that sends from another thread
    (:func:`posts_sends`)."""
    job = records["job"]
    if not posts_sends(job):
        return 0.0
    warm, iters = int(job["warmup_iterations"]), int(job["iterations"])
    held = [
        sum(s[5] - s[4] for s in r["spans"] if s[1] == SEND and warm <= s[6] < warm + iters)
        for r in records["ranks"]
        if r.get("role", "worker") == "worker"
    ]
    return max(held, default=0.0) / max(iters, 1)


def isend_overhead_s(
    records: Mapping[str, Any], base: Trace, cpu_s_per_message: float, cpu_s_per_byte: float
) -> float | None:
    """How long handing a message to gloo held a real run's sending thread beyond the
    CPU the simulator charges the message's sending end (``cpu_s_per_message`` and
    ``cpu_s_per_byte`` of its bytes, ``HostSpec.message_cpu``), as ``HostSpec.isend_s``
    means it: the workers' send spans of the measured iterations charged and scaled as
    :func:`trace_from_run` charges compute (so that the thread's time is the trace's or
    the sends', never both nor neither), their mean less that CPU, never below zero;
    ``None`` for a scheme whose ranks do not send on their main thread
    (:func:`posts_sends`) or a run without sends."""
    job = records["job"]
    if not posts_sends(job):
        return None
    warm = int(job["warmup_iterations"])
    shares = _gap_shares(records, base)
    charged, nbytes = [], 0
    for r in records["ranks"]:
        if r.get("role", "worker") != "worker":
            continue
        for kind, _name, _it, size, c in _charged_spans(r, warm, shares, True):
            if kind == ISEND:
                charged.append(c)
                nbytes += size
    if not charged:
        return None
    per_message = statistics.fmean(charged)
    return max(0.0, per_message - cpu_s_per_message - cpu_s_per_byte * nbytes / len(charged))


def trace_from_run(records: Mapping[str, Any], base: Trace) -> Trace:
    """The layer trace of ``base``'s model with the compute times a real run measured:
    a profile taken inside the runtime itself.

    A profiler that times each layer alone leaves out what the runtime does between two
    layers (hooks, Python, a pipeline stage's functional call and its weight copies),
    which on a CPU is a good part of a small layer's time. Here every forward or backward
    span of the measured iterations is charged from the end of the span before it on the
    same rank's compute stream (any kind: the previous layer, the loss, a wait) to its own
    end, so a pass's layers add up to the pass; layers the runtime does not record (those
    without parameters, in data-parallel runs) ran inside the recorded span that follows
    them in forward and precedes them in backward, and get their share of it by
    ``base``'s times (:func:`_spread_to_unrecorded`), except where a wait comes between:
    the time from a recorded span to a wait right after it is then theirs (split by
    ``base``'s times of them, equally if those are 0), since they ran before the wait.
    Where a rank's main thread hands its messages to gloo between two spans (the
    pipelines' and gossip's ``isend``), that time is the sends' and not the next
    layer's: the simulator holds the rank for it (:func:`isend_overhead_s`).
    Means over the passes are used (the simulator predicts a mean iteration).

    Where the ranks shared the cores (a pipeline's stages, more ranks than cores), a
    span's wall time includes the time its rank waited for a core. The charged times of
    each rank are then scaled by :func:`cpu_factor`: what its main thread's CPU clock
    says the compute stream used, over what the spans add up to. The trace holds the work
    of each layer, and the simulator's CPU host shares the cores out again. The trace's
    batch is the run's samples per pass (its micro-batch for pipelines). Raises
    ``ValueError`` when the records hold no layer spans or name layers ``base`` lacks.
    """
    job = records["job"]
    warm = int(job["warmup_iterations"])
    plan = job.get("pipeline") or {}
    batch = int(job["batch_size"]) // int(plan.get("microbatches", 1) or 1)
    index = {layer.name: i for i, layer in enumerate(base.layers)}
    shares = _gap_shares(records, base)
    posted = posts_sends(job)
    samples: dict[tuple[str, str], list[float]] = {}
    gap_s: dict[tuple[str, str], float] = {}
    for r in records["ranks"]:
        if r.get("role", "worker") != "worker":
            continue
        for kind, name, _it, _layer, charged in _charged_spans(r, warm, shares, posted):
            if kind == GAP:
                after_kind, _sep, after = name.partition(":")
                key = (after_kind, after)
                gap_s[key] = gap_s.get(key, 0.0) + charged
            elif kind in (FORWARD, BACKWARD):
                if name not in index:
                    raise ValueError(f"the run recorded layer {name!r}, which the trace lacks")
                samples.setdefault((kind, name), []).append(charged)
    # a gap's layers ran in every pass, before a wait only in some (the others' time is
    # in the next recorded span): their mean is over the passes of the layer before them
    for (kind, after), seconds in gap_s.items():
        passes = len(samples.get((kind, after), ())) or 1
        for unrecorded, share in shares[(kind, after)]:
            samples[(kind, unrecorded)] = [seconds * share / passes]
    if not samples:
        raise ValueError("the records hold no forward or backward spans of measured iterations")
    means = _spread_to_unrecorded({key: statistics.fmean(v) for key, v in samples.items()}, base)
    layers = [
        replace(
            layer,
            forward_s=means.get((FORWARD, layer.name), 0.0),
            backward_s=means.get((BACKWARD, layer.name), 0.0),
        )
        for layer in base.layers
    ]
    meta = replace(
        base.meta,
        batch_size=batch,
        provenance=f"measured inside a {job['scheme']} run of {len(records['ranks'])} "
        f"rank(s) by dtsim (realrun.metrics.trace_from_run); means over the measured "
        f"iterations' spans, in main-thread CPU time",
    )
    scaled = base.rescale_batch(batch)
    return Trace(
        meta,
        tuple(
            replace(x, activation_bytes=y.activation_bytes, flops=y.flops)
            for x, y in zip(layers, scaled.layers)
        ),
        base.edges,
    )


def _spread_to_unrecorded(
    means: Mapping[tuple[str, str], float], base: Trace
) -> dict[tuple[str, str], float]:
    """``means`` (each recorded layer's mean charged time by ``(kind, name)``) with the
    time of the layers the run did not record handed back to them.

    A forward span is charged from the end of the span before it, so it holds the
    forward of the unrecorded layers that ran between the recorded layer before it and
    itself (in ``base``'s order); a backward span holds the backward of the unrecorded
    layers between itself and the recorded layer after it (backward runs in reverse).
    Unrecorded are the layers without parameters that no span names (the data-parallel
    runtimes time layers by their parameters' hooks); a layer with parameters that no
    span names ran elsewhere (another stage's rank). Each such group's time is split
    over its layers in proportion to ``base``'s times of them (a profile of each layer
    alone): kept together, a stage cut between a pooling layer and the convolution after
    it would put the pooling's forward on the wrong stage. A group whose ``base`` times
    are all 0 stays on the recorded layer."""
    out = dict(means)
    names = [layer.name for layer in base.layers]
    seen = {name for _kind, name in means}
    unrecorded = {
        layer.name for layer in base.layers if layer.name not in seen and layer.param_bytes == 0
    }
    for kind, step in ((FORWARD, -1), (BACKWARD, 1)):
        for i, name in enumerate(names):
            if (kind, name) not in means:
                continue
            group = [i]
            j = i + step
            while 0 <= j < len(names) and names[j] in unrecorded:
                group.append(j)
                j += step
            if len(group) == 1:
                continue
            weights = [
                base.layers[k].forward_s if kind == FORWARD else base.layers[k].backward_s
                for k in group
            ]
            total = sum(weights)
            if total <= 0:
                continue
            for k, w in zip(group, weights):
                out[(kind, names[k])] = means[(kind, name)] * w / total
    return out


def median_trace(traces: Sequence[Trace]) -> Trace:
    """One trace from in-run traces of the same model and batch (:func:`trace_from_run`
    of repeated runs): each layer's forward and backward time is the median over them,
    everything else the first one's. Raises ``ValueError`` for none, or traces of
    different layers."""
    if not traces:
        raise ValueError("no traces to take the median of")
    first = traces[0]
    names = [layer.name for layer in first.layers]
    if any([layer.name for layer in t.layers] != names for t in traces[1:]):
        raise ValueError("the traces to take the median of have different layers")
    if len(traces) == 1:
        return first
    layers = tuple(
        replace(
            layer,
            forward_s=statistics.median(t.layers[i].forward_s for t in traces),
            backward_s=statistics.median(t.layers[i].backward_s for t in traces),
        )
        for i, layer in enumerate(first.layers)
    )
    meta = replace(first.meta, provenance=f"{first.meta.provenance}; median of {len(traces)} runs")
    return Trace(meta, layers, first.edges)


ISEND = "isend"
"""Kind of a :func:`_charged_spans` entry: a main thread's time handing a message to
gloo (a send span of a scheme that :func:`posts_sends`), charged like compute."""
GAP = "gap"
"""Kind of a :func:`_charged_spans` entry: the main thread's time between a forward or
backward span and a wait right after it, when layers the runtime does not record ran
there (named ``"<kind>:<layer of the span>"``)."""

GapShares = Mapping[tuple[str, str], list[tuple[str, float]]]
"""``(kind, recorded layer) -> [(unrecorded layer, share)]`` (:func:`_gap_shares`)."""


def _gap_shares(
    records: Mapping[str, Any], base: Trace
) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """For each recorded ``(kind, layer)`` of ``records`` that the pass follows with
    layers the runtime does not record (forward: the next layers of ``base``; backward:
    the previous ones; never the input), those layers with their shares of a gap after
    it: in proportion to ``base``'s times of them, equal where those are all 0."""
    recorded = {
        (s[2], s[3])
        for r in records["ranks"]
        if r.get("role", "worker") == "worker"
        for s in r["spans"]
        if s[1] == COMPUTE and s[2] in (FORWARD, BACKWARD)
    }
    index = {layer.name: i for i, layer in enumerate(base.layers)}
    out = {}
    for kind, name in recorded:
        i = index.get(name)
        if i is None:
            continue
        step = 1 if kind == FORWARD else -1
        run = []
        j = i + step
        while (
            0 <= j < len(base.layers)
            and base.layers[j].kind != "input"
            and (kind, base.layers[j].name) not in recorded
        ):
            run.append(base.layers[j])
            j += step
        if not run:
            continue
        times = [x.forward_s if kind == FORWARD else x.backward_s for x in run]
        total = sum(times)
        out[(kind, name)] = [
            (x.name, t / total if total > 0 else 1.0 / len(run))
            for x, t in zip(run, times, strict=True)
        ]
    return out


def _charged_spans(
    rank: Mapping[str, Any], warm: int, gaps: GapShares | None = None, sends: bool = False
) -> list[tuple[str, str, int, int, float]]:
    """``(kind, name, iteration, layer, charged seconds)`` of the rank's compute spans of
    measured iterations (``layer`` -1 for a span of no one layer), each charged from the
    end of the span before it (waits get none), scaled by the rank's :func:`cpu_factor`.
    With ``sends`` (:func:`posts_sends`) the main thread's send spans between
    compute spans are charged too, as entries of kind :data:`ISEND` (the simulator holds
    a sending rank for them: ``HostSpec.isend_s``, :func:`isend_overhead_s`; their
    ``layer`` is the message's bytes), not in the span after; a send from inside a
    compute span (gossip's gradients, sent by hooks during the backward) stays that
    span's.

    With ``gaps``, the time from a forward or backward span that ``gaps`` names to a
    wait right after it is an entry of kind :data:`GAP`: the layers the runtime does not
    record ran then (a gossip worker waits for its partner's gradients just before each
    layer with parameters, so the layers without them in between run before the wait,
    not in the next recorded span); that time counts as compute for the factor too."""
    marked = [int(k) for k in rank.get("main_cpu_at_end") or {}]
    last = max(marked) if marked else float("inf")
    streams = (COMPUTE, SEND) if sends else (COMPUTE,)
    stream = sorted(
        (s for s in rank["spans"] if s[1] in streams and warm <= s[6] <= last),
        key=lambda s: s[4],
    )
    out = []
    last_end = None
    previous = None
    for s in stream:
        kind, name, start, end = s[2], s[3], s[4], s[5]
        begin = start if last_end is None else min(last_end, start)
        if s[1] == SEND:  # the thread's time in the send is not the next span's
            if last_end is not None and start < last_end:
                continue  # sent from inside the span before (gossip's gradient hooks)
            out.append((ISEND, name, int(s[6]), int(s[9]), end - begin))  # bytes, no layer
            last_end = end
            continue
        if kind != "wait":  # realrun.runtime.WAIT (this module does not import torch)
            out.append((kind, name, int(s[6]), int(s[7]), end - begin))
            previous = (kind, name)
        else:
            if gaps and previous in gaps and start > begin:
                out.append((GAP, f"{previous[0]}:{previous[1]}", int(s[6]), -1, start - begin))
            previous = None
        last_end = end
    factor = cpu_factor(rank, warm, sum(c for *_k, c in out))
    return [(k, n, it, layer, c * factor) for k, n, it, layer, c in out]


def cpu_factor(rank: Mapping[str, Any], warm: int, charged_s: float) -> float:
    """The main thread's CPU seconds over the measured iterations divided by
    ``charged_s``, the wall time its compute spans were charged in them, where that is
    below 1: the rank waited for a core while it computed. Else 1: the CPU the thread
    spent outside its spans (posting and waiting for messages) is the simulator's
    per-message cost, not compute; also 1 when the records lack the CPU clock (runs
    recorded before it was added)."""
    marks = rank.get("main_cpu_at_end") or {}
    done = sorted(int(k) for k in marks)
    if charged_s <= 0 or (warm - 1) not in done or len(done) < 2 or done[-1] < warm:
        return 1.0
    cpu = marks[str(done[-1])] - marks[str(warm - 1)]
    return min(1.0, cpu / charged_s) if cpu > 0 else 1.0


@dataclass(frozen=True)
class UpdateCost:
    """The simulator's model of an optimizer step measured in a real run:
    ``overhead_s + passes * param_bytes / bytes_per_s`` (``gpu.step_overhead_s`` and
    ``gpu.memory_bandwidth_bytes_per_s``)."""

    bytes_per_s: float
    overhead_s: float = 0.0


def messenger_cpu_s_per_message(
    records: Mapping[str, Any], cpu_s_per_byte: float, cpu_s_per_message: float = 0.0
) -> float | None:
    """The CPU seconds a message end cost a real run's processes beyond
    ``cpu_s_per_message`` and ``cpu_s_per_byte`` of its bytes (what the simulator already
    charges every message: ``HostSpec.message_cpu`` and the per-byte part of
    ``HostSpec.p2p_cpu``), as ``HostSpec.p2p_message_cpu_s`` means it, never below zero;
    ``None`` when no rank used a :class:`realrun.runtime.Messenger`. Warm-up included:
    every iteration sends the same messages.

    A rank's messaging costs its whole process's CPU over the messenger's life less its
    main thread's (compute, charged as such) and the scheme's handling of received
    messages (a server's aggregation and update, charged as such): the messenger's own
    threads and gloo's, which move the bytes of posted sends and receives on threads of
    their own (the messenger threads' clocks alone would miss gloo's). Records made before
    the process clock was kept fall back to the messenger threads' clocks."""
    cpu = messages = nbytes = 0
    for r in records["ranks"]:
        m = r.get("messenger")
        if not m:
            continue
        if "process_cpu_s" in m:
            cpu += float(m["process_cpu_s"]) - float(m["main_cpu_s"]) - float(m["handling_cpu_s"])
        else:
            cpu += float(m["cpu_s"]) + float(m.get("gloo_cpu_s", 0.0))
        messages += int(m["messages"])
        nbytes += int(m["bytes"])
    if not messages:
        return None
    return max(0.0, (cpu - cpu_s_per_byte * nbytes) / messages - cpu_s_per_message)


def posted_cpu_s_per_end(
    records: Mapping[str, Any], cpu_s_per_message: float, cpu_s_per_byte: float
) -> float | None:
    """The CPU seconds each end of a message cost a real pipeline run's transport
    threads beyond what the simulator charges off the ranks' threads, as
    ``HostSpec.posted_cpu_s`` means it: over the measured iterations, the workers'
    process clocks less their main threads' (gloo's threads reading and writing the
    sockets; the main thread's own part of a send is its compute stream's, see
    :func:`isend_overhead_s`), less ``cpu_s_per_message`` and ``cpu_s_per_byte`` of
    every received message (the receiving end's work the simulator charges), over the
    message ends (sends and receives), never below zero. ``None`` for a scheme that is
    not a pipeline, a run without messages in the measured iterations, or records made
    before the main thread's clock was kept."""
    job = records["job"]
    if not get_scheme(job["scheme"]).pipeline:
        return None
    warm, iters = int(job["warmup_iterations"]), int(job["iterations"])
    first, last = str(warm - 1), str(warm + iters - 1)
    off = charged = 0.0
    ends = 0
    for r in records["ranks"]:
        if r.get("role", "worker") != "worker":
            continue
        proc, main = r.get("cpu_at_end") or {}, r.get("main_cpu_at_end") or {}
        if not all(k in clock for clock in (proc, main) for k in (first, last)):
            return None
        off += (proc[last] - proc[first]) - (main[last] - main[first])
        for sp in r["spans"]:
            if sp[1] in (SEND, RECV) and warm <= sp[6] < warm + iters:
                ends += 1
                if sp[1] == RECV:
                    charged += cpu_s_per_message + cpu_s_per_byte * sp[9]
    if not ends:
        return None
    return max(0.0, (off - charged) / ends)


def server_step_overhead_s(
    records: Mapping[str, Any], passes: int, bytes_per_s: float
) -> float | None:
    """The fixed CPU cost of a parameter server's update of one shard in a real run,
    beyond ``passes`` shard-sized passes at ``bytes_per_s`` (the simulator's model of a
    server's step on CPU hosts: ``gpu.step_overhead_s`` plus the passes at
    ``gpu.memory_bandwidth_bytes_per_s``): the servers' receiving threads' CPU in the scheme's
    handling of messages (storing pushes, adding them, the optimizer step, queueing the
    values: ``handling_cpu_s``), over every shard update of the run, less the passes,
    never below zero. ``None`` without servers or with records made before the handling
    was clocked. A server updates every shard it keeps once an iteration (its placement:
    ``[layer, server, bytes]`` rows, servers numbered from the first rank after the
    workers); warm-up iterations count, as the handling is clocked over the whole run.
    The per-shard calls, more than the bytes, are what a server costs
    (docs/validation.md)."""
    job = records["job"]
    total_its = int(job["warmup_iterations"]) + int(job["iterations"])
    workers = int(job["workers"])
    cpu = 0.0
    steps = nbytes = 0
    for r in records["ranks"]:
        m = r.get("messenger") or {}
        if r.get("role") != "server" or "handling_cpu_s" not in m:
            continue
        me = int(r["rank"]) - workers
        mine = [int(nb) for _layer, server, nb in r.get("placement") or () if int(server) == me]
        cpu += float(m["handling_cpu_s"])
        steps += len(mine) * total_its
        nbytes += sum(mine) * total_its
    if not steps:
        return None
    return max(0.0, (cpu - passes * nbytes / bytes_per_s) / steps)


def update_cost(records: Mapping[str, Any], base: Trace, passes: int) -> UpdateCost:
    """The optimizer step's cost in a real run, the simulator's model of an update
    (``SimContext.update_s``: a fixed overhead plus ``passes`` weight-sized passes over
    the parameters). Each update span is charged and scaled as :func:`trace_from_run`
    does, mean over the rank's steps: a span of no one layer is a step (a pipeline
    stage may take several an iteration), and the spans of one iteration that name
    layers add up to one (``gossip`` steps layer by layer). ``passes`` counts what the
    simulator's step makes of the weights (``gossip``: its averaging too). A pipeline's
    stages each update their own layers of ``base`` (a stage's replicas count once);
    with stages of two or more sizes, the overhead and the bandwidth are the
    least-squares line of the stages' times over their bytes (a stage without weights
    still takes the overhead). One size, or a line that does not rise from a
    non-negative overhead: no overhead, and the bandwidth is all the stages' bytes over
    their time. ``ValueError`` when the run recorded no update."""
    xs, ys = _stage_means(records, base, UPDATE)
    xs = [passes * x for x in xs]
    if len(set(xs)) >= 2:
        slope, intercept = statistics.linear_regression(xs, ys)
        if slope > 0 and intercept >= 0:
            return UpdateCost(1.0 / slope, intercept)
    return UpdateCost(sum(xs) / max(sum(ys), 1e-9))


def _stage_means(
    records: Mapping[str, Any], base: Trace, span_kind: str
) -> tuple[list[float], list[float]]:
    """``(param_bytes, seconds)`` per stage (the whole model without a pipeline) of the
    rank's ``span_kind`` spans of measured iterations, charged as :func:`trace_from_run`
    does, mean over a stage's spans and then over its replicas: a span of no one layer
    is one operation, and the spans of one iteration that name layers add up to one.
    ``ValueError`` when the run recorded none."""
    warm = int(records["job"]["warmup_iterations"])
    stage_layers = (records["job"].get("pipeline") or {}).get("stage_layers")
    per_stage: dict[int, list[float]] = {}
    shares = _gap_shares(records, base)
    posted = posts_sends(records["job"])
    for r in records["ranks"]:
        if r.get("role", "worker") != "worker":
            continue
        ops: list[float] = []
        by_layer: dict[int, float] = {}  # an iteration's operation taken layer by layer
        for kind, _n, it, layer, charged in _charged_spans(r, warm, shares, posted):
            if kind == span_kind and layer < 0:
                ops.append(charged)
            elif kind == span_kind:
                by_layer[it] = by_layer.get(it, 0.0) + charged
        ops += by_layer.values()
        if ops:
            stage = int(r.get("stage", 0))
            per_stage.setdefault(stage, []).append(statistics.fmean(ops))
    if not per_stage:
        raise ValueError(f"the records hold no {span_kind} spans of measured iterations")
    xs, ys = [], []
    for stage, means in sorted(per_stage.items()):
        layers = stage_layers[stage] if stage_layers else range(len(base.layers))
        xs.append(float(sum(base.layers[i].param_bytes for i in layers)))
        ys.append(statistics.fmean(means))
    return xs, ys


def predict_overhead_s(
    records: Mapping[str, Any], base: Trace, passes: int, bytes_per_s: float
) -> float:
    """The fixed cost of a SpecTrain weight prediction in a real run beyond ``passes``
    weight-sized passes at ``bytes_per_s`` (the simulator's model: ``gpu.predict_overhead_s``
    plus the passes at ``gpu.memory_bandwidth_bytes_per_s``, the bandwidth fitted to the optimizer
    steps by :func:`update_cost`): the mean over the stages of each stage's mean
    prediction span (charged as :func:`trace_from_run` does) less its passes, never
    below zero, so the stages' predictions add up to what the run spent. ``ValueError``
    when the run recorded no prediction."""
    xs, ys = _stage_means(records, base, PREDICT)
    beyond = [y - passes * x / bytes_per_s for x, y in zip(xs, ys, strict=True)]
    return max(0.0, statistics.fmean(beyond))
