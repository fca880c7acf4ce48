"""Putting ready-made events straight onto a SimPy environment's queue.

``env.schedule(event, priority, delay)`` pushes ``(now + delay, priority, id, event)`` onto
the environment's heap, ``id`` from the environment's own counter. The hot paths of the
simulator (compute ops, chunk hops) know the absolute time an event fires, so they push
the very same tuple themselves: one Python call and one addition less per event, with
identical ordering (same priority, same id sequence). This relies on SimPy 4's
``Environment._queue`` and ``Environment._eid`` (pinned in ``pyproject.toml``);
:func:`event_queue` checks that they are there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from simpy import Environment

NORMAL = 1
"""SimPy's priority of ordinary events (``simpy.core.NORMAL``)."""


def event_queue(env: Environment) -> tuple[list[tuple[Any, ...]], Iterator[int]]:
    """``(heap, id_counter)`` of ``env``: push ``(time_s, NORMAL, next(id_counter),
    event)`` onto ``heap`` with :func:`heapq.heappush` to schedule ``event`` at ``time_s``.

    Raises ``RuntimeError`` if this SimPy does not keep them (dtsim needs SimPy 4)."""
    queue = getattr(env, "_queue", None)
    eid = getattr(env, "_eid", None)
    if not isinstance(queue, list) or eid is None:
        raise RuntimeError("this SimPy version is not supported: dtsim needs SimPy 4.x "
                           "(Environment._queue and _eid)")
    return queue, eid
