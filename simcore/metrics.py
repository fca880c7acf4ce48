"""Metrics as pure functions of the run's records.

* Iteration ``i`` ends when the last rank finishes it. The steady-state window runs from
  the end of the last warm-up iteration (or time 0 without warm-up) to the end of the
  last iteration; ``iteration_time_s`` is its length over the measured iterations.
* Utilisation of a GPU is its busy compute time inside the window over the window's
  length (compute spans of one device never overlap, so busy time is their clipped sum).
* ``bubble_fraction`` is the mean idle fraction of the GPUs' compute streams in the
  window (``1 - gpu_utilization``): pipeline fill and drain for pipeline schemes, exposed
  communication and synchronisation for data-parallel ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def iteration_ends(iteration_end: Sequence[Sequence[float]]) -> list[float]:
    """End time of each iteration: the latest rank's."""
    return [max(row) for row in iteration_end]


def steady_window(ends: Sequence[float], warmup: int) -> tuple[float, float]:
    """``(t0, t1)``: from the end of the warm-up iterations to the end of the last one."""
    t0 = ends[warmup - 1] if warmup > 0 else 0.0
    return t0, ends[-1]


def iteration_durations(ends: Sequence[float]) -> list[float]:
    """Length of each iteration (the first one measured from time 0)."""
    out, prev = [], 0.0
    for e in ends:
        out.append(e - prev)
        prev = e
    return out


def busy_seconds(compute_log: Iterable[tuple[Any, ...]], devices: Sequence[str], t0: float,
                 t1: float) -> list[float]:
    """Compute-stream busy seconds of each device in ``devices`` within ``[t0, t1]``,
    from compute-log tuples (:data:`~simcore.records.COMPUTE_LOG_FIELDS`)."""
    pos = {d: i for i, d in enumerate(devices)}
    busy = [0.0] * len(devices)
    for dev, _kind, _name, s, e, *_rest in compute_log:
        i = pos.get(dev)
        if i is None:
            continue
        if s < t0:
            s = t0
        if e > t1:
            e = t1
        if e > s:
            busy[i] += e - s
    return busy


def utilization(busy: Sequence[float], t0: float, t1: float) -> list[float]:
    """Busy seconds over the window length, clamped to [0, 1]."""
    span = t1 - t0
    if span <= 0:
        return [0.0 for _ in busy]
    return [min(1.0, max(0.0, b / span)) for b in busy]


def bytes_by_kind(link_counters: Iterable[tuple[Any, int, int, float]]) -> dict[str, int]:
    """Bytes carried per link kind, summed over link directions."""
    out: dict[str, int] = {}
    for link, sent, _recv, _busy in link_counters:
        if sent:
            out[link.kind] = out.get(link.kind, 0) + sent
    return out
