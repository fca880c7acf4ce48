"""The heartbeat file through which ranks report progress to the spawner. No torch here.

One slot of :data:`HEARTBEAT_SLOT_BYTES` per rank: the monotonic time of the rank's latest
progress (double), how far it got (int64), ``iteration * PHASES + phase``, and what it did
last (the latest span it recorded, a short text: :data:`LABEL_BYTES`). The spawner
(:mod:`realrun.launch`) makes the file and reads it; each rank (:mod:`realrun.worker`)
writes its own slot through a shared memory map.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

FORMAT = "<dq"
"""The head of a slot: time (double), progress (int64)."""
HEAD_BYTES = struct.calcsize(FORMAT)
LABEL_BYTES = 48
"""The tail of a slot: the rank's latest span, UTF-8, padded with zero bytes."""

HEARTBEAT_SLOT_BYTES = HEAD_BYTES + LABEL_BYTES
"""Per rank in the heartbeat file: the monotonic time of its latest progress (double),
how far it got (int64), ``iteration * PHASES + phase``, and its latest span's label."""

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
            self._map[self._offset : self._offset + HEAD_BYTES] = struct.pack(
                FORMAT, time.monotonic(), iteration * PHASES + phase
            )

    def label(self, text: str) -> None:
        """What this rank did last (cut to :data:`LABEL_BYTES`)."""
        if self._map is not None:
            data = text.encode("utf-8", "replace")[:LABEL_BYTES].ljust(LABEL_BYTES, b"\0")
            head = self._offset + HEAD_BYTES
            self._map[head : head + LABEL_BYTES] = data


def read_heartbeats(path: str, ranks: int) -> list[tuple[float, int]]:
    """``(monotonic time, iteration)`` of every rank's latest progress (0.0 if none)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEARTBEAT_SLOT_BYTES * ranks)
    except OSError:
        return [(0.0, -1)] * ranks
    head = HEAD_BYTES
    out = []
    for r in range(ranks):
        chunk = data[r * HEARTBEAT_SLOT_BYTES : r * HEARTBEAT_SLOT_BYTES + head]
        out.append(struct.unpack(FORMAT, chunk) if len(chunk) == head else (0.0, -1))
    return out


def read_labels(path: str, ranks: int) -> list[str]:
    """Every rank's latest span label (``""`` if none)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEARTBEAT_SLOT_BYTES * ranks)
    except OSError:
        return [""] * ranks
    head = HEAD_BYTES
    out = []
    for r in range(ranks):
        start = r * HEARTBEAT_SLOT_BYTES + head
        raw = data[start : start + LABEL_BYTES]
        out.append(raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
    return out
