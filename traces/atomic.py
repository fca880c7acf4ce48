"""Writing files so that a failure never leaves a half-written one behind.

Every writer of the project (trace files, Chrome traces, sweep tables, figures, reports)
writes to a temporary file beside the target, flushes it to disk and renames it over the
target only when everything went well.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class OutputPathError(ValueError):
    """A file cannot be written where asked: its folder is missing or not writable."""


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`OutputPathError`, naming ``path`` and its folder, unless a file can be
    written there. Commands call it before they start long work."""
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    if os.path.isdir(target):
        raise OutputPathError(f"{target}: is a folder; give a file name")
    if not os.path.isdir(folder):
        raise OutputPathError(f"{target}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputPathError(f"{target}: folder {folder} is not writable")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[str]:
    """A temporary path beside ``path`` to write to (ending in ``suffix``, for tools that
    go by the extension); renamed over ``path`` after an ``fsync`` when the block
    succeeds, removed when it fails."""
    target = os.fspath(path)
    check_writable(target)
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.tmp-{os.getpid()}{suffix}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
