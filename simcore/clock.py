"""The one module that touches SimPy's private internals.

The simulator's hot events (a compute op finishing, a chunk reaching the end of a link)
know the absolute time they fire, so instead of creating a :class:`simpy.Timeout` each
time they push ``(time_s, NORMAL, id, event)`` straight onto the environment's heap, ids
from the environment's own counter: the very tuple ``env.schedule`` would push, so the
order of events is the same, for one Python call and one object less per event. That
needs SimPy 4's ``Environment._queue`` and ``Environment._eid``, and events shaped the way
``Environment.step`` reads them (``callbacks``, ``_ok``, ``_value``).

Everything private is here: :class:`FastEvent` (the event shape), :class:`EventQueue`
(pushing, with the check SimPy does, that nothing is scheduled in the past) and
:func:`scheduled_events` (SimPy's event counter). :func:`check_simpy` verifies the
internals; ``tests/test_clock.py`` runs it, so a SimPy release that changes them fails
the tests loudly. The SimPy releases this was tested with are pinned in
``pyproject.toml`` (:data:`TESTED_SIMPY`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappush
from typing import Any

import simpy
from simpy import Environment

TESTED_SIMPY = ">=4.1.2,<4.2"
"""The SimPy releases the internals were checked on (the pin in ``pyproject.toml``)."""

NORMAL = 1
"""SimPy's priority of ordinary events (``simpy.core.NORMAL``)."""


class SimPyInternalsChanged(RuntimeError):
    """This SimPy keeps its event queue differently from the releases dtsim supports."""


class FastEvent:
    """The smallest object SimPy's ``Environment.step`` can process: callbacks to call,
    successful, without a value. Subclasses add ``__slots__`` of their own. Nothing can
    ``yield`` it but a process that only waits for it; it cannot be combined with
    ``&``/``|`` or ``AllOf``."""

    __slots__ = ("callbacks",)
    _ok = True
    _value = None

    def __init__(self, callbacks: list[Callable[[Any], None]] | None = None) -> None:
        self.callbacks: list[Callable[[Any], None]] = callbacks if callbacks is not None else []


class EventQueue:
    """Schedules events at absolute times on ``env``'s heap (see module docs).

    Raises :class:`SimPyInternalsChanged` if this SimPy has no such heap."""

    __slots__ = ("_heap", "_ids", "env")

    def __init__(self, env: Environment) -> None:
        heap = getattr(env, "_queue", None)
        ids = getattr(env, "_eid", None)
        if not isinstance(heap, list) or not isinstance(ids, itertools.count):
            raise SimPyInternalsChanged(
                f"SimPy {simpy.__version__} is not supported: dtsim needs SimPy "
                f"{TESTED_SIMPY} (Environment._queue and _eid)"
            )
        self.env, self._heap, self._ids = env, heap, ids

    def at(self, time_s: float, event: Any) -> None:
        """Fire ``event`` at simulated time ``time_s`` (``ValueError`` if that is in the
        past: a negative delay, which SimPy refuses too)."""
        if time_s < self.env._now:
            raise ValueError(
                f"negative delay: an event at {time_s!r} s is before now ({self.env._now!r} s)"
            )
        heappush(self._heap, (time_s, NORMAL, next(self._ids), event))


def scheduled_events(env: Environment) -> int:
    """Events ``env`` has scheduled so far (SimPy numbers them; the counter is internal);
    ``-1`` when this SimPy does not say."""
    ids = getattr(env, "_eid", None)
    return next(ids) if isinstance(ids, itertools.count) else -1


def check_simpy() -> None:
    """Check that SimPy's internals are what this module relies on: events pushed here
    interleave with SimPy's own in the order ``env.schedule`` gives, at the right times,
    and a past time is refused. Raises :class:`SimPyInternalsChanged` otherwise."""
    env = Environment()
    queue = EventQueue(env)
    fired: list[tuple[str, float]] = []
    fast = FastEvent([lambda ev: fired.append(("fast", env.now))])
    queue.at(2.0, fast)
    timeout = env.timeout(2.0)
    timeout.callbacks.append(lambda ev: fired.append(("timeout", env.now)))
    early = FastEvent([lambda ev: fired.append(("early", env.now))])
    queue.at(1.0, early)
    env.run()
    want = [("early", 1.0), ("fast", 2.0), ("timeout", 2.0)]
    if fired != want:
        raise SimPyInternalsChanged(
            f"SimPy {simpy.__version__}: events fired as {fired}, expected {want}"
        )
    if env.now != 2.0 or scheduled_events(env) != 3:
        raise SimPyInternalsChanged(
            f"SimPy {simpy.__version__}: clock or event counter not where expected"
        )
    try:
        queue.at(1.5, FastEvent())
    except ValueError:
        return
    raise SimPyInternalsChanged("a past time was accepted")
