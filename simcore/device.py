"""GPU devices: a compute stream and a memory account.

The compute stream runs one kernel (here: one layer's forward or backward) at a time, in
the order work is issued. Because work is issued in simulated-time order, the finish time
of each piece is known when it is issued (``max(now, busy_until) + duration``), so a
compute op costs exactly one simulation event.
"""

from __future__ import annotations

import math
from typing import Any

from simpy import Environment, Timeout

from simcore.records import COMPUTE

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


class Gpu:
    """One GPU: rank, device index and name, compute stream, memory account.

    Attributes:
        rank: the rank it runs.
        device: index in the topology.
        name: device name.
        busy_until: when the compute stream becomes free.
        memory: the :class:`MemoryAccount`.
    """

    __slots__ = ("_append", "busy_until", "device", "env", "memory", "name", "rank", "spans")

    def __init__(self, env: Environment, rank: int, device: int, name: str,
                 spans: list[tuple[Any, ...]]) -> None:
        self.env, self.rank, self.device, self.name = env, rank, device, name
        self.busy_until = 0.0
        self.memory = MemoryAccount()
        self.spans = spans
        self._append = spans.append

    def compute(self, duration: float, kind: str, name: str = "", iteration: int = -1,
                layer: int = -1, microbatch: int = -1) -> Timeout:
        """Queue ``duration`` seconds of work on the compute stream; the returned event
        fires when it is done (a SimPy process yields it)."""
        env = self.env
        now = env._now
        start = self.busy_until
        if start < now:
            start = now
        end = start + duration
        self.busy_until = end
        self._append((self.name, COMPUTE, kind, name, start, end, iteration, layer, microbatch,
                      0, -1))
        return Timeout(env, end - now)


class JitteryGpu(Gpu):
    """A :class:`Gpu` whose compute times vary: each op's duration is multiplied by a
    log-normal factor with mean 1 and coefficient of variation ``cv``, drawn from its own
    ``numpy.random.Generator``."""

    __slots__ = ("_factors", "_next", "_rng", "_sigma")

    def __init__(self, env: Environment, rank: int, device: int, name: str,
                 spans: list[tuple[Any, ...]], rng: Any, cv: float) -> None:
        super().__init__(env, rank, device, name, spans)
        self._rng = rng
        self._sigma = math.sqrt(math.log1p(cv * cv))
        self._factors: list[float] = []
        self._next = 0

    def compute(self, duration: float, kind: str, name: str = "", iteration: int = -1,
                layer: int = -1, microbatch: int = -1) -> Timeout:
        if self._next >= len(self._factors):
            s = self._sigma
            self._factors = self._rng.lognormal(-0.5 * s * s, s, 4096).tolist()
            self._next = 0
        factor = self._factors[self._next]
        self._next += 1
        return super().compute(duration * factor, kind, name, iteration, layer, microbatch)
