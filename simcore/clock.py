"""The one module that touches SimPy's private internals.

The simulator's hot events (a compute op finishing, a chunk reaching the end of a link)
know the absolute time they fire, so instead of creating a :class:`simpy.Timeout` each
time they push ``(time_s, NORMAL, id, event)`` straight onto the environment's heap, ids
from the environment's own counter: the very tuple ``env.schedule`` would push, so the
order of events is the same, for one Python call and one object less per event. That
needs SimPy 4's ``Environment._queue`` and ``Environment._eid``, and events shaped the way
``Environment.step`` reads them (``callbacks``, ``_ok``, ``_value``).

Everything private is here: :class:`FastEvent` (the event shape), :class:`EventQueue`
(pushing, with the check SimPy does, that nothing is scheduled in the past, or without
it where the caller knows),
:func:`run_to_end` (``Environment.run()`` without a method call per event) and
:func:`scheduled_events` (SimPy's event counter). :func:`check_simpy` verifies the
internals; ``tests/test_clock.py`` runs it, so a SimPy release that changes them fails
the tests loudly. The SimPy releases this was tested with are pinned in
``pyproject.toml`` (:data:`TESTED_SIMPY`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from heapq import heappop, heappush
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

    __slots__ = ("_heap", "_ids", "env", "push")

    def __init__(self, env: Environment) -> None:
        heap = getattr(env, "_queue", None)
        ids = getattr(env, "_eid", None)
        if not isinstance(heap, list) or not isinstance(ids, itertools.count):
            raise SimPyInternalsChanged(
                f"SimPy {simpy.__version__} is not supported: dtsim needs SimPy "
                f"{TESTED_SIMPY} (Environment._queue and _eid)"
            )
        self.env, self._heap, self._ids = env, heap, ids

        def push(time_s: float, event: Any) -> None:
            heappush(heap, (time_s, NORMAL, next(ids), event))

        self.push: Callable[[float, Any], None] = push
        """:meth:`at` without its check, for a caller whose times are never before now
        (the end of a delay known to be >= 0): the same tuple on the same heap, from a
        closure over both (no method, no attribute lookups), for the hottest events."""

    def at(self, time_s: float, event: Any) -> None:
        """Fire ``event`` at simulated time ``time_s`` (``ValueError`` if that is in the
        past: a negative delay, which SimPy refuses too)."""
        if time_s < self.env._now:
            raise ValueError(
                f"negative delay: an event at {time_s!r} s is before now ({self.env._now!r} s)"
            )
        heappush(self._heap, (time_s, NORMAL, next(self._ids), event))


def run_to_end(env: Environment) -> None:
    """Process ``env``'s events until none is left: what ``env.run()`` does, event by
    event the way ``Environment.step`` does it (the clock set to the event's time, its
    callbacks called in order, a failed event that nothing defused raised as a copy of
    its exception), in one loop instead of a method call per event."""
    queue = env._queue
    pop = heappop
    while queue:
        env._now, _, _, event = pop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc


def scheduled_events(env: Environment) -> int:
    """Events ``env`` has scheduled so far (SimPy numbers them; the counter is internal);
    ``-1`` when this SimPy does not say."""
    ids = getattr(env, "_eid", None)
    return next(ids) if isinstance(ids, itertools.count) else -1


def _fired_order(
    run: Callable[[Environment], Any],
) -> tuple[list[tuple[str, float]], Environment]:
    """Fast events (pushed checked and unchecked) and a SimPy timeout at the same and
    at earlier times, run by ``run``:
    the order and times they fired in, and the environment."""
    env = Environment()
    queue = EventQueue(env)
    fired: list[tuple[str, float]] = []
    queue.at(2.0, FastEvent([lambda ev: fired.append(("fast", env.now))]))
    timeout = env.timeout(2.0)
    timeout.callbacks.append(lambda ev: fired.append(("timeout", env.now)))
    queue.at(1.0, FastEvent([lambda ev: fired.append(("early", env.now))]))
    queue.push(2.0, FastEvent([lambda ev: fired.append(("pushed", env.now))]))
    run(env)
    return fired, env


def check_simpy() -> None:
    """Check that SimPy's internals are what this module relies on: events pushed here
    interleave with SimPy's own in the order ``env.schedule`` gives, at the right times,
    under ``env.run()`` and :func:`run_to_end` alike, and a past time is refused. Raises
    :class:`SimPyInternalsChanged` otherwise."""
    want = [("early", 1.0), ("fast", 2.0), ("timeout", 2.0), ("pushed", 2.0)]
    for run in (Environment.run, run_to_end):
        fired, env = _fired_order(run)
        if fired != want:
            raise SimPyInternalsChanged(
                f"SimPy {simpy.__version__}: events fired as {fired}, expected {want}"
            )
        if env.now != 2.0 or scheduled_events(env) != 4:
            raise SimPyInternalsChanged(
                f"SimPy {simpy.__version__}: clock or event counter not where expected"
            )
    try:
        EventQueue(env).at(1.5, FastEvent())
    except ValueError:
        return
    raise SimPyInternalsChanged("a past time was accepted")
