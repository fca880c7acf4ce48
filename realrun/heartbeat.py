"""The heartbeat file through which ranks report progress to the spawner. No torch here.

One slot of :data:`HEARTBEAT_SLOT_BYTES` per rank: the monotonic time of the rank's latest
progress (double) and how far it got (int64), ``iteration * PHASES + phase``. The spawner
(:mod:`realrun.launch`) makes the file and reads it; each rank (:mod:`realrun.worker`)
writes its own slot through a shared memory map.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

FORMAT = "<dq"
"""A slot: time (double), progress (int64)."""

HEARTBEAT_SLOT_BYTES = struct.calcsize(FORMAT)
"""Per rank in the heartbeat file: the monotonic time of its latest progress (double) and
how far it got (int64), ``iteration * PHASES + phase``."""

PHASES = 4
"""Steps of an iteration a worker reports: 0 started, 1 forward done, 2 backward done,
3 iteration done. A server reports ``(iterations it has served) * PHASES``."""


class Heartbeat:
    """Writes this rank's progress into its slot of the shared heartbeat file (if any)."""

    def __init__(self, path: str, rank: int) -> None:
        self._map: mmap.mmap | None = None
        self._offset = rank * HEARTBEAT_SLOT_BYTES
        if os.path.exists(path):
            fd = os.open(path, os.O_RDWR)
            try:
                self._map = mmap.mmap(fd, 0)
            finally:
                os.close(fd)

    def beat(self, iteration: int, phase: int = 0) -> None:
        """Progress now: ``phase`` of ``iteration`` reached."""
        if self._map is not None:
            self._map[self._offset : self._offset + HEARTBEAT_SLOT_BYTES] = struct.pack(
                FORMAT, time.monotonic(), iteration * PHASES + phase
            )


def read_heartbeats(path: str, ranks: int) -> list[tuple[float, int]]:
    """``(monotonic time, iteration)`` of every rank's latest progress (0.0 if none)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEARTBEAT_SLOT_BYTES * ranks)
    except OSError:
        return [(0.0, -1)] * ranks
    out = []
    for r in range(ranks):
        chunk = data[r * HEARTBEAT_SLOT_BYTES : (r + 1) * HEARTBEAT_SLOT_BYTES]
        out.append(
            struct.unpack(FORMAT, chunk) if len(chunk) == HEARTBEAT_SLOT_BYTES else (0.0, -1)
        )
    return out
