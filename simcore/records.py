"""Span records: what happened where and when, as immutable tuples.

A :class:`Span` is one interval on one stream of one device: a layer's forward on a GPU's
compute stream, a message on a sender's ``send`` and a receiver's ``recv`` stream, a
collective on a GPU's ``comm`` stream. While it runs the simulator appends compact
compute-log tuples (cheap); the result holds plain tuples in :class:`Span` field order and
:meth:`RunResult.span_records` hands them out as named tuples. The real runs record the
same schema.
"""

from __future__ import annotations

from typing import Any, NamedTuple

COMPUTE, SEND, RECV, COMM = "compute", "send", "recv", "comm"
STREAMS = (COMPUTE, SEND, RECV, COMM)
"""Stream names, in the order they are drawn (Chrome trace thread ids)."""

FORWARD, BACKWARD, UPDATE = "forward", "backward", "update"
RECOMPUTE, PREDICT = "recompute", "predict"
"""Kinds of compute spans."""


COMPUTE_LOG_FIELDS = (
    "device",
    "kind",
    "name",
    "start_s",
    "end_s",
    "iteration",
    "layer",
    "microbatch",
)
"""Field order of the compact compute-log tuples the simulator appends while it runs
(a :class:`Span` on the ``compute`` stream without its constant fields)."""


def compute_span(entry: tuple[Any, ...]) -> tuple[Any, ...]:
    """A compute-log tuple expanded to :class:`Span` field order."""
    dev, kind, name, start, end, it, layer, mb = entry
    return (dev, COMPUTE, kind, name, start, end, it, layer, mb, 0, -1)


class Span(NamedTuple):
    """One interval on one stream.

    Attributes:
        device: device name (``gpu3``, ``n1.gpu0``, ``ps0``).
        stream: one of :data:`STREAMS`.
        kind: ``forward``, ``backward``, ``update``, ``send``, ``recv``, ``allreduce``...
        name: label (layer name, message tag).
        start_s, end_s: simulated seconds.
        iteration: iteration index (``-1`` if none).
        layer: layer index in the trace (``-1`` if none).
        microbatch: micro-batch index (``-1`` if none).
        nbytes: bytes moved (0 for compute).
        flow: id linking a send to its receive (``-1`` if none).
    """

    device: str
    stream: str
    kind: str
    name: str
    start_s: float
    end_s: float
    iteration: int = -1
    layer: int = -1
    microbatch: int = -1
    nbytes: int = 0
    flow: int = -1

    @property
    def duration_s(self) -> float:
        """``end_s - start_s``."""
        return self.end_s - self.start_s


class LinkRecord(NamedTuple):
    """What one link direction carried over the run."""

    name: str
    kind: str
    sent_bytes: int
    received_bytes: int
    busy_s: float


class RunRecords(NamedTuple):
    """Everything the metrics are computed from, taken from the run once it has ended
    (:func:`simcore.engine.simulate`); :mod:`simcore.metrics` reads nothing else.

    Attributes:
        iteration_end: ``iteration_end[i][r]``: when rank ``r`` finished iteration ``i``.
        busy_by_iteration: per rank, compute seconds by iteration label.
        ops: compute ops run, per rank.
        links: per link direction, its :class:`LinkRecord`.
        transfers: ``(payload bytes, iteration)`` of every message, in the order sent,
            then of every multi-rank collective computed in closed form (analytic
            fidelity), at the bytes its algorithm's messages would carry.
        chunk_transfers: chunk transfers of all messages (per message, hops times
            chunks; one for a message of the analytic model or without hops).
        closed_form_collectives: multi-rank collectives computed in one event.
        traffic_scale: real payload bytes per simulated byte (mirrored clusters).
        peak_memory_bytes: per rank, the peak of its memory account.
        peak_breakdown: per rank, the memory account's categories at its peak.
        end_s: simulated time at the end of the run.
        messages: number of messages.
    """

    iteration_end: tuple[tuple[float, ...], ...]
    busy_by_iteration: tuple[dict[int, float], ...]
    ops: tuple[int, ...]
    links: tuple[LinkRecord, ...]
    transfers: tuple[tuple[int, int], ...]
    chunk_transfers: int
    closed_form_collectives: int
    traffic_scale: float
    peak_memory_bytes: tuple[float, ...]
    peak_breakdown: tuple[dict[str, float], ...]
    end_s: float
    messages: int
