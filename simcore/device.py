"""GPU devices: a compute stream and a memory account.

The compute stream runs one kernel (here: one layer's forward or backward) at a time, in
the order work is issued. When spans are recorded, each op is logged as a compact tuple
``(device, kind, name, start_s, end_s, iteration, layer, microbatch)`` in the shared
compute log (see :data:`simcore.records.COMPUTE_LOG_FIELDS`). Because work is issued in
simulated-time order, the finish time of each piece is known when it is issued
(``max(now, busy_until) + duration``), so a compute op costs exactly one simulation event.
"""

from __future__ import annotations

import math
from typing import Any

from simpy import Environment

from simcore.clock import EventQueue, FastEvent

MEMORY_KINDS = ("weights", "gradients", "optimizer", "stash", "activations", "buffers")
"""Categories of the memory account."""


class MemoryAccount:
    """Bytes held per category, and the peak of their sum.

    ``peak_breakdown`` is the per-category split at the moment of the peak.
    """

    __slots__ = ("held", "peak", "peak_breakdown", "total")

    def __init__(self) -> None:
        self.held = dict.fromkeys(MEMORY_KINDS, 0)
        self.total = 0
        self.peak = 0
        self.peak_breakdown = dict(self.held)

    def alloc(self, kind: str, nbytes: int) -> None:
        """Hold ``nbytes`` more of ``kind``."""
        self.held[kind] += nbytes
        self.total += nbytes
        if self.total > self.peak:
            self.peak = self.total
            self.peak_breakdown = dict(self.held)

    def free(self, kind: str, nbytes: int) -> None:
        """Release ``nbytes`` of ``kind`` (never below zero)."""
        nbytes = min(nbytes, self.held[kind])
        self.held[kind] -= nbytes
        self.total -= nbytes


class Done(FastEvent):
    """A lightweight event that fires at a scheduled time (what :meth:`Gpu.compute`
    returns). A SimPy process can ``yield`` it like a timeout; it is not a full
    :class:`simpy.events.Event` and cannot be combined with ``&``/``|`` or ``AllOf``:
    for that, wait on it from a helper process. Compute ops are the commonest events of a
    simulation, and this keeps each one cheap (see :mod:`simcore.clock`)."""

    __slots__ = ()


class Run(list):
    """Compute ops of one iteration meant to be queued together (see
    :meth:`Gpu.enqueue`): a list of ``(duration_s, kind, name, iteration, layer,
    microbatch)`` tuples that also keeps their ``iteration`` and ``durations``, so that a
    GPU not recording spans can queue the run without looking at each op."""

    __slots__ = ("durations", "iteration")

    def __init__(self, iteration: int, ops: list[tuple[float, str, str, int, int, int]]) -> None:
        super().__init__(ops)
        self.iteration = iteration
        self.durations = [op[0] for op in ops]


class Gpu:
    """One GPU: rank, device index and name, compute stream, memory account.

    Attributes:
        rank: the rank it runs.
        device: index in the topology.
        name: device name.
        busy_until: when the compute stream becomes free.
        memory: the :class:`MemoryAccount`.

    Besides the optional compute log (for span records), the GPU sums its busy seconds
    per iteration label (:attr:`busy_by_iteration`), from which utilisation is computed.
    """

    __slots__ = (
        "_at",
        "_log",
        "busy_by_iteration",
        "busy_until",
        "device",
        "env",
        "memory",
        "name",
        "ops",
        "rank",
    )

    def __init__(
        self,
        env: Environment,
        rank: int,
        device: int,
        name: str,
        compute_log: list[tuple[Any, ...]] | None,
    ) -> None:
        self.env, self.rank, self.device, self.name = env, rank, device, name
        self.busy_until = 0.0
        self.memory = MemoryAccount()
        self._log = compute_log.append if compute_log is not None else None
        self._at = EventQueue(env).at
        self.busy_by_iteration: dict[int, float] = {}
        """Compute seconds queued so far, by the ops' iteration label."""
        self.ops = 0
        """Compute ops queued so far."""

    def compute(
        self,
        duration_s: float,
        kind: str,
        name: str = "",
        iteration: int = -1,
        layer: int = -1,
        microbatch: int = -1,
    ) -> Done:
        """Queue ``duration_s`` seconds of work on the compute stream; the returned
        :class:`Done` event fires when it is done (a SimPy process yields it).
        ``ValueError`` for a negative duration."""
        if duration_s < 0:
            raise ValueError(f"negative compute duration {duration_s!r} s ({kind} {name})")
        ev = Done()
        self._at(self._put(duration_s, kind, name, iteration, layer, microbatch), ev)
        return ev

    def compute_seq(self, ops: list[tuple[float, str, str, int, int, int]]) -> Done:
        """Queue several ops back to back, each ``(duration, kind, name, iteration, layer,
        microbatch)``; the returned :class:`Done` fires when the last is done.

        Each op is logged and counted as if issued alone by :meth:`compute` the moment
        the previous one ended, so times and spans are the same, but the whole run costs
        one event. Only valid when nothing else is queued on this GPU meanwhile, which
        holds for a worker that owns its GPU's stream."""
        ev = Done()
        self._at(self.enqueue(ops), ev)
        return ev

    def enqueue(self, ops: list[tuple[float, str, str, int, int, int]]) -> float:
        """Queue ops like :meth:`compute_seq` but without an event, for work nobody has to
        wait for; returns when the last one ends (seconds)."""
        now = self.env.now
        end = self.busy_until
        if end < now:
            end = now
        by_it = self.busy_by_iteration
        log = self._log
        if log is None and type(ops) is Run:
            # The same additions in the same order as op by op: identical times and sums.
            it = ops.iteration
            busy = by_it.get(it, 0.0)
            for duration in ops.durations:
                end += duration
                busy += duration
            by_it[it] = busy
        elif log is None:
            for duration, _kind, _label, iteration, _layer, _mb in ops:
                end += duration
                by_it[iteration] = by_it.get(iteration, 0.0) + duration
        else:
            name = self.name
            for duration, kind, label, iteration, layer, microbatch in ops:
                begin = end
                end += duration
                by_it[iteration] = by_it.get(iteration, 0.0) + duration
                log((name, kind, label, begin, end, iteration, layer, microbatch))
        if ops:
            self.busy_until = end
            self.ops += len(ops)
        return end

    def _put(
        self, duration_s: float, kind: str, name: str, iteration: int, layer: int, microbatch: int
    ) -> float:
        """Put one op on the stream and log it; returns when it ends."""
        now = self.env.now
        start = self.busy_until
        if start < now:
            start = now
        end = start + duration_s
        self.busy_until = end
        by_it = self.busy_by_iteration
        by_it[iteration] = by_it.get(iteration, 0.0) + duration_s
        self.ops += 1
        if self._log is not None:
            self._log((self.name, kind, name, start, end, iteration, layer, microbatch))
        return end


class LogNormalFactors:
    """Log-normal factors with mean 1 and coefficient of variation ``cv``, drawn from
    ``rng`` (a ``numpy.random.Generator``) in blocks: what a device with varying compute
    times multiplies each op's duration by."""

    __slots__ = ("_factors", "_next", "_rng", "_sigma")

    def __init__(self, rng: Any, cv: float) -> None:
        self._rng = rng
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._factors: list[float] = []
        self._next = 0

    def __call__(self) -> float:
        """The next factor."""
        if self._next >= len(self._factors):
            s = self._sigma
            self._factors = self._rng.lognormal(-0.5 * s * s, s, 4096).tolist()
            self._next = 0
        factor = self._factors[self._next]
        self._next += 1
        return factor


class JitteryGpu(Gpu):
    """A :class:`Gpu` whose compute times vary: each op's duration is multiplied by the
    next of its :class:`LogNormalFactors`."""

    __slots__ = ("_factor",)

    def __init__(
        self,
        env: Environment,
        rank: int,
        device: int,
        name: str,
        compute_log: list[tuple[Any, ...]] | None,
        factor: LogNormalFactors,
    ) -> None:
        super().__init__(env, rank, device, name, compute_log)
        self._factor = factor

    def _put(
        self, duration_s: float, kind: str, name: str, iteration: int, layer: int, microbatch: int
    ) -> float:
        return super()._put(duration_s * self._factor(), kind, name, iteration, layer, microbatch)

    def enqueue(self, ops: list[tuple[float, str, str, int, int, int]]) -> float:
        return super().enqueue([(d * self._factor(), *rest) for d, *rest in ops])
