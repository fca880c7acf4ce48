"""Metrics as pure functions of the run's records.

* Iteration ``i`` of a rank ends when that rank has done its part of it; the iteration
  as a whole ends when the last rank has (:func:`iteration_ends`, from which
  ``iteration_times_s`` come).
* ``iteration_time_s`` is the steady-state iteration time: for each rank, the time from
  the end of its last warm-up iteration (or time 0 without warm-up) to the end of its
  last iteration, over the number of measured iterations; the slowest rank's is the
  answer (:func:`steady_iteration_time`). In a synchronous scheme every rank gives the
  same; in an asynchronous pipeline the rank of the bottleneck stage, which is busy all
  the time, sets the pace, and a rank still running ahead of it after the fill cannot
  make the pipeline look faster than it can sustain.
* Utilisation of a GPU is the compute time of its work in the measured iterations (ops
  carry their iteration) over the measured iterations' length, ``iterations *
  iteration_time_s``, clamped to [0, 1] (:func:`utilization`). Work done ahead of time,
  like the next iteration's forward overlapping this iteration's parameter pulls,
  counts for its own iteration.
* ``bubble_fraction`` is the mean idle fraction, ``1 - gpu_utilization``: pipeline fill
  and drain for pipeline schemes, exposed communication and synchronisation for
  data-parallel ones.
* Communication totals say what they cover: ``comm_bytes_total`` (and the per-link and
  per-kind counters) is the payload of the *whole* run, warm-up iterations (and a
  pipeline's lead and tail) included; ``comm_bytes_measured`` only that of the measured
  iterations, and ``comm_bytes_per_iteration`` is it over the measured iterations
  (:func:`payload_bytes`).

Every function here is pure: it reads the run's records
(:class:`~simcore.records.RunRecords`), never the simulator's live objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from simcore.records import LinkRecord, RunRecords


def iteration_ends(iteration_end: Sequence[Sequence[float]]) -> list[float]:
    """End time of each iteration: the latest rank's."""
    return [max(row) for row in iteration_end]


def iteration_durations(ends: Sequence[float]) -> list[float]:
    """Length of each iteration (the first one measured from time 0)."""
    out, prev = [], 0.0
    for e in ends:
        out.append(e - prev)
        prev = e
    return out


def rank_periods(iteration_end: Sequence[Sequence[float]], warmup: int) -> list[float]:
    """Each rank's mean iteration time over the measured iterations (see module docs);
    ``iteration_end[i][r]`` is when rank ``r`` finished iteration ``i``."""
    measured = len(iteration_end) - warmup
    last = iteration_end[-1]
    first = iteration_end[warmup - 1] if warmup > 0 else [0.0] * len(last)
    return [(e - s) / measured for s, e in zip(first, last, strict=True)]


def steady_iteration_time(iteration_end: Sequence[Sequence[float]], warmup: int) -> float:
    """The slowest rank's mean iteration time over the measured iterations."""
    return max(rank_periods(iteration_end, warmup))


def utilization(busy_s: Sequence[float], measured_s: float) -> list[float]:
    """Busy seconds over the measured time, clamped to [0, 1]."""
    if measured_s <= 0:
        return [0.0 for _ in busy_s]
    return [min(1.0, max(0.0, b / measured_s)) for b in busy_s]


def busy_by_device(
    compute_log: Iterable[tuple[Any, ...]], devices: Sequence[str], first: int, last: int
) -> list[float]:
    """Compute seconds of each device's ops labelled with iterations ``first .. last``,
    from compute-log tuples (:data:`~simcore.records.COMPUTE_LOG_FIELDS`); the span view
    of what each :class:`~simcore.device.Gpu` counts as it runs."""
    pos = {d: i for i, d in enumerate(devices)}
    busy = [0.0] * len(devices)
    for dev, _kind, _name, start, end, it, *_rest in compute_log:
        i = pos.get(dev)
        if i is not None and first <= it <= last:
            busy[i] += end - start
    return busy


def busy_between(busy_by_iteration: Mapping[int, float], first: int, last: int) -> float:
    """Compute seconds of the ops labelled with iterations ``first .. last``."""
    return sum(busy_by_iteration.get(i, 0.0) for i in range(first, last + 1))


def bytes_by_kind(links: Iterable[LinkRecord]) -> dict[str, int]:
    """Bytes carried per link kind, summed over link directions."""
    out: dict[str, int] = {}
    for link in links:
        if link.sent_bytes:
            out[link.kind] = out.get(link.kind, 0) + link.sent_bytes
    return out


def payload_bytes(
    transfers: Iterable[tuple[int, int]], first: int, last: int, traffic_scale: float = 1.0
) -> tuple[int, float]:
    """``(whole run, measured iterations first .. last)`` payload bytes of
    ``(bytes, iteration)`` transfers, scaled by ``traffic_scale`` (the whole-run total
    rounded to bytes)."""
    total = measured = 0
    for nbytes, it in transfers:
        total += nbytes
        if first <= it <= last:
            measured += nbytes
    if traffic_scale != 1.0:
        return round(total * traffic_scale), measured * traffic_scale
    return total, measured


def link_utilization(links: Iterable[LinkRecord], end_s: float) -> dict[str, float]:
    """Busy fraction of each link direction that carried bytes, over the whole run."""
    return {
        link.name: (link.busy_s / end_s if end_s > 0 else 0.0) for link in links if link.sent_bytes
    }


def model_events(records: RunRecords) -> int:
    """Events of the simulated system: every compute op finishing, every chunk of a
    message reaching the end of a link (a whole message in the analytic model, which has
    no chunks; one per collective computed in closed form). A run of layers or a one-hop
    message costs the scheduler one event but is as many model events as it simulates."""
    return sum(records.ops) + records.chunk_transfers + records.closed_form_collectives
