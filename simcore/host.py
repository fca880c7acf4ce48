"""CPU hosts: ranks that compute on processor cores shared with each other and with the
work that moves their bytes.

A GPU cluster gives every rank a device of its own; a CPU cluster, and above all the
emulated cluster of ``sim real --cluster netns`` (every host a network namespace of one
machine), does not. Its ranks are processes on a machine with ``C`` cores, and the
machine's cores also run what communication costs the CPU: the socket copies on both
ends of every message, a fixed per-message cost (framing, system calls, the runtime's
own code) and the sums of a collective's reduction.

:class:`CpuPool` is the machine's cores. With one run queue (``balance_s`` 0) they are
shared by processor sharing, the fluid limit of a time-slicing scheduler: ``n`` runnable
tasks each progress at ``min(1, C / n)`` core-seconds per second. With a run queue per
core (``balance_s`` > 0, as Linux keeps them) the tasks of one core share it, a woken
thread goes to an idle core if there is one and else back to its own, and an idle core
takes over work queued elsewhere only after ``balance_s``: cores can idle beside queued
work (:mod:`realrun.scheduler` measures the delay; docs/cpu_hosts.md). A task needs one
core at most (one thread).
:class:`CpuStream` is one thread's work: tasks run one at a time in the order they were
queued, each one runnable on the pool while it is at the head. :class:`CpuRank` is a
rank whose compute stream is such a thread; it offers :class:`~simcore.device.Gpu`'s
interface, so every scheme runs on it unchanged. Communication work is not on a rank's
stream: the transport queues it on the pool as tasks of its own (see
:class:`simcore.transport.CommCpu`), as a rank's communication threads are.

Because the rate of every runnable task changes whenever one starts or ends, finish
times are not known when work is issued (unlike a GPU's stream): the pool keeps one
pending wake-up for its earliest finisher and recomputes it on every change. That costs
a pass over the runnable tasks per event, which is nothing for the few processes of one
machine and is only ever paid by topologies that declare a ``host`` section.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from simpy import Environment

from simcore.clock import EventQueue, FastEvent
from simcore.device import Done, Gpu, LogNormalFactors
from simcore.topology import GlooSpec, HostSpec

__all__ = ["CpuPool", "CpuRank", "CpuStream", "GlooSpec", "HostSpec"]

_EPS_S = 1e-12
"""Work left below this many core-seconds counts as done (rounding of rate x time)."""


class _Task:
    __slots__ = ("core", "done", "holds", "left", "thread")

    def __init__(
        self, work_s: float, done: Callable[[], None], holds: bool, thread: Any = None
    ) -> None:
        self.left = work_s
        self.done = done
        self.holds = holds
        self.thread = thread
        self.core = -1


class _Wake(FastEvent):
    __slots__ = ("generation",)

    def __init__(self, callback: Callable[[Any], None], generation: int) -> None:
        super().__init__([callback])
        self.generation = generation


class CpuPool:
    """``cores`` cores shared by the runnable tasks (module docs).

    With ``balance_s`` 0 the cores are one run queue under processor sharing: ``n``
    runnable tasks each progress at ``min(1, cores / n)``. With ``balance_s`` > 0 each
    core has a run queue of its own, shared by processor sharing among the tasks on it
    (the scheduler's time slices, averaged): a task goes to an idle core if there is one
    (the core its thread last ran on first), else to its thread's last core (the least
    loaded one for a thread never seen); a thread that goes on computing keeps its core;
    and a core left idle while another holds two or more tasks takes one of them over
    only after ``balance_s`` (the scheduler's periodic load balancing). Idle cores beside
    queued work are what this machine's scheduler shows (docs/cpu_hosts.md).

    Attributes:
        cores: the number of cores.
        balance_s: see above.
        busy_s: core-seconds of work done so far.
    """

    __slots__ = (
        "_at",
        "_generation",
        "_holding",
        "_last",
        "_on",
        "_running",
        "_steal_at",
        "_threads",
        "balance_s",
        "busy_s",
        "cores",
        "env",
    )

    def __init__(self, env: Environment, cores: int, balance_s: float = 0.0) -> None:
        if cores < 1:
            raise ValueError(f"a host needs at least one core, got {cores}")
        if not (balance_s >= 0 and math.isfinite(balance_s)):
            raise ValueError(f"balance_s must be seconds, 0 or more; got {balance_s!r}")
        self.env, self.cores, self.balance_s = env, cores, balance_s
        self._at = EventQueue(env).at
        self._running: dict[_Task, None] = {}
        self._holding = 0  # runnable tasks that hold a core for whole slices
        self._last = 0.0
        self._generation = 0
        self.busy_s = 0.0
        # per-core run queues (balance_s > 0)
        self._on: list[dict[_Task, None]] = [{} for _ in range(cores)]
        self._steal_at: list[float | None] = [None] * cores
        self._threads: dict[Any, tuple[int, float]] = {}  # thread: (core, when it left)

    @property
    def holding(self) -> int:
        """Runnable tasks now that hold a core for whole time slices (threads' compute;
        communication's short bursts of CPU do not count)."""
        return self._holding

    def rate(self) -> float:
        """Core-seconds per second each runnable task gets now (one shared run queue)."""
        n = len(self._running)
        return 1.0 if n <= self.cores else self.cores / n

    def run(
        self, work_s: float, done: Callable[[], None], holds: bool = False, thread: Any = None
    ) -> None:
        """Make ``work_s`` core-seconds of work runnable now; ``done()`` is called (from
        the simulation loop) when it has been done. ``holds``: the work is a thread's
        compute, which keeps its core for whole time slices (:attr:`holding`).
        ``thread``: any hashable naming the thread the work runs on (per-core run
        queues place it by where that thread ran last)."""
        self._advance()
        task = _Task(max(work_s, 0.0), done, holds, thread)
        self._running[task] = None
        self._holding += holds
        if self.balance_s > 0:
            task.core = self._place(thread)
            self._on[task.core][task] = None
            self._balance()
        self._reschedule()

    def _place(self, thread: Any) -> int:
        now = self.env.now
        last = self._threads.get(thread) if thread is not None else None
        if last is not None and last[1] == now:
            return last[0]  # the thread did not sleep: it keeps its core
        on = self._on
        idle = [k for k in range(self.cores) if not on[k]]
        if idle:
            return last[0] if last is not None and last[0] in idle else idle[0]
        if last is not None:
            return last[0]
        return min(range(self.cores), key=lambda k: len(on[k]))

    def _balance(self) -> None:
        """Start (or stop) each core's wait before it takes over a task of a busier one."""
        counts = [len(q) for q in self._on]
        crowded = max(counts) >= 2
        for k in range(self.cores):
            if counts[k] == 0 and crowded:
                if self._steal_at[k] is None:
                    self._steal_at[k] = self.env.now + self.balance_s
            else:
                self._steal_at[k] = None

    def _steal(self) -> None:
        """Idle cores whose wait is over take the newest task of the busiest core."""
        now = self.env.now
        for k in range(self.cores):
            at = self._steal_at[k]
            if at is None or at > now + _EPS_S:
                continue
            self._steal_at[k] = None
            src = max(range(self.cores), key=lambda c: len(self._on[c]))
            if not self._on[k] and len(self._on[src]) >= 2:
                task = next(reversed(self._on[src]))
                del self._on[src][task]
                task.core = k
                self._on[k][task] = None
        self._balance()

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        self._last = now
        if dt <= 0 or not self._running:
            return
        if self.balance_s > 0:
            for q in self._on:
                if q:
                    step = dt / len(q)
                    self.busy_s += dt
                    for task in q:
                        task.left -= step
            return
        step = dt * self.rate()
        self.busy_s += step * len(self._running)
        for task in self._running:
            task.left -= step

    def _reschedule(self) -> None:
        self._generation += 1
        now = self.env.now
        if self.balance_s > 0:
            firsts = [now + max(min(t.left for t in q), 0.0) * len(q) for q in self._on if q]
            firsts += [at for at in self._steal_at if at is not None]
            if firsts:
                self._at(min(firsts), _Wake(self._wake, self._generation))
            return
        if not self._running:
            return
        first = min(task.left for task in self._running)
        at = now + max(first, 0.0) / self.rate()
        self._at(at, _Wake(self._wake, self._generation))

    def _wake(self, ev: _Wake) -> None:
        if ev.generation != self._generation:
            return  # superseded by a later change
        self._advance()
        finished = [t for t in self._running if t.left <= _EPS_S]
        for task in finished:
            del self._running[task]
            self._holding -= task.holds
        if self.balance_s > 0:
            now = self.env.now
            for task in finished:
                del self._on[task.core][task]
                if task.thread is not None:
                    self._threads[task.thread] = (task.core, now)
            self._steal()
        self._reschedule()
        for task in finished:
            task.done()


class CpuStream:
    """One thread's work on a :class:`CpuPool`: tasks run one at a time, in order.

    ``on_done(start_s, end_s, info)`` is called for every finished task with the ``info``
    it was queued with; a task may also carry its own callback.
    """

    __slots__ = ("_head", "_pending", "_start", "env", "on_done", "pool")

    def __init__(
        self, pool: CpuPool, on_done: Callable[[float, float, Any], None] | None = None
    ) -> None:
        self.pool, self.env, self.on_done = pool, pool.env, on_done
        self._pending: deque[tuple[float, Any, Callable[[float], None] | None]] = deque()
        self._head = False
        self._start = 0.0

    @property
    def idle(self) -> bool:
        """Nothing queued or running."""
        return not self._head

    def submit(
        self, work_s: float, info: Any = None, then: Callable[[float], None] | None = None
    ) -> None:
        """Queue ``work_s`` core-seconds; ``then(end_s)`` is called when it is done."""
        if work_s < 0:
            raise ValueError(f"negative CPU work {work_s!r} s")
        self._pending.append((work_s, info, then))
        if not self._head:
            self._next()

    def _next(self) -> None:
        if not self._pending:
            self._head = False
            return
        self._head = True
        self._start = self.env.now
        work, info, then = self._pending[0]
        self.pool.run(work, lambda: self._finished(info, then), holds=True, thread=self)

    def _finished(self, info: Any, then: Callable[[float], None] | None) -> None:
        self._pending.popleft()
        now = self.env.now
        if self.on_done is not None:
            self.on_done(self._start, now, info)
        self._next()
        if then is not None:
            then(now)


class CpuRank(Gpu):
    """A rank computing on a CPU thread of a shared :class:`CpuPool`.

    It has :class:`~simcore.device.Gpu`'s interface; what differs is that an op's end is
    known only when it happens, so :meth:`enqueue` returns ``nan`` and ``busy_until`` is
    the current time while work is queued (``0`` otherwise is never read for a busy
    rank). An op's recorded span is its wall time on the shared cores, and the busy time
    counted for utilisation is that wall time too, as a profiler on the real rank sees it.
    With ``factor`` (a :class:`~simcore.device.LogNormalFactors`) each op's CPU work is
    multiplied by the next factor it draws (``compute_jitter``).
    """

    __slots__ = ("_ev_at", "_factor", "stream")

    def __init__(
        self,
        env: Environment,
        rank: int,
        device: int,
        name: str,
        compute_log: list[tuple[Any, ...]] | None,
        pool: CpuPool,
        factor: LogNormalFactors | None = None,
    ) -> None:
        super().__init__(env, rank, device, name, compute_log)
        self.stream = CpuStream(pool, self._record)
        self._ev_at = EventQueue(env).at
        self._factor = factor

    def _record(self, start: float, end: float, info: Any) -> None:
        if info is None:  # a message this thread wrote (transport.CommCpu.join): not compute
            return
        kind, label, iteration, layer, microbatch = info
        by_it = self.busy_by_iteration
        by_it[iteration] = by_it.get(iteration, 0.0) + (end - start)
        if self._log is not None:
            self._log((self.name, kind, label, start, end, iteration, layer, microbatch))

    def _fire(self, ev: Done) -> Callable[[float], None]:
        return lambda end: self._ev_at(end, ev)

    def compute(
        self,
        duration_s: float,
        kind: str,
        name: str = "",
        iteration: int = -1,
        layer: int = -1,
        microbatch: int = -1,
    ) -> Done:
        if duration_s < 0:
            raise ValueError(f"negative compute duration {duration_s!r} s ({kind} {name})")
        if self._factor is not None:
            duration_s *= self._factor()
        ev = Done()
        self.ops += 1
        self.busy_until = self.env.now
        self.stream.submit(duration_s, (kind, name, iteration, layer, microbatch), self._fire(ev))
        return ev

    def compute_seq(self, ops: list[tuple[float, str, str, int, int, int]]) -> Done:
        ev = Done()
        if not ops:
            self._ev_at(self.env.now, ev)
            return ev
        *head, last = list(ops)
        self.enqueue(head)
        d, kind, label, iteration, layer, microbatch = last
        if self._factor is not None:
            d *= self._factor()
        self.ops += 1
        self.stream.submit(d, (kind, label, iteration, layer, microbatch), self._fire(ev))
        return ev

    def enqueue(self, ops: list[tuple[float, str, str, int, int, int]]) -> float:
        factor = self._factor
        for d, kind, label, iteration, layer, microbatch in ops:
            if factor is not None:
                d *= factor()
            self.ops += 1
            self.stream.submit(d, (kind, label, iteration, layer, microbatch))
        if ops:
            self.busy_until = self.env.now
        return math.nan
