"""Writing files so that a failure never leaves a half-written one behind.

Every writer of the project (trace files, Chrome traces, sweep tables, figures, reports)
writes to a temporary file beside the target, flushes it to disk and renames it over the
target only when everything went well.

Only regular files are replaced that way. A symbolic link is followed: its target is
written (atomically, if it is a regular file or does not exist yet) and the link stays.
A named pipe, a character or block device (``/dev/null``, ``/dev/stdout``) and ``-``
(standard output) are written straight into once the output is complete (they cannot be
renamed over, and replacing them would destroy them); a write error there (``/dev/full``)
is an :class:`OutputPathError`. Anything else that is not a regular file (a socket) is
refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator

_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)
"""Write errors that come from the place written to, not from the program."""

STDOUT = "-"
"""The path that means standard output."""


class OutputPathError(ValueError):
    """A file cannot be written where asked: its folder is missing or not writable, or it
    is something that cannot be written (a socket), or writing it failed."""


def _kind(target: str) -> str:
    """``missing``, ``regular``, ``stream`` (pipe, character or block device, ``-``),
    ``folder`` or ``other`` for ``target`` (symbolic links followed)."""
    if target == STDOUT:
        return "stream"
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        raise OutputPathError(f"{target}: {exc.strerror or exc}") from None
    if stat.S_ISREG(mode):
        return "regular"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "stream"
    return "other"


def resolve_output(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``(path to write, kind)``: symbolic links resolved to their final target (a link to
    a missing file resolves to that file), and what :func:`_kind` says of it."""
    target = os.fspath(path)
    if target != STDOUT and os.path.islink(target):
        target = os.path.realpath(target)
    return target, _kind(target)


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise :class:`OutputPathError`, naming ``path`` and its folder, unless a file can be
    written there. Commands call it before they start long work."""
    given = os.fspath(path)
    target, kind = resolve_output(given)
    shown = given if target == given else f"{given} (-> {target})"
    if kind == "folder":
        raise OutputPathError(f"{shown}: is a folder; give a file name")
    if kind == "other":
        raise OutputPathError(
            f"{shown}: is not a regular file, a pipe or a device; give a file name"
        )
    if kind == "stream":
        if target != STDOUT and not os.access(target, os.W_OK):
            raise OutputPathError(f"{shown}: is not writable")
        return
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise OutputPathError(f"{shown}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise OutputPathError(f"{shown}: folder {folder} is not writable")
    if kind == "regular" and not os.access(target, os.W_OK):
        raise OutputPathError(f"{shown}: is not writable")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], suffix: str = "") -> Iterator[str]:
    """A temporary path to write to (ending in ``suffix``, for tools that go by the
    extension). For a regular (or new) file it lies beside the target and is renamed over
    it after an ``fsync`` when the block succeeds; for a pipe, a device or ``-`` its bytes
    are copied into the target when the block succeeds (see module docs). The temporary
    file is removed in any case."""
    given = os.fspath(path)
    check_writable(given)
    target, kind = resolve_output(given)
    if kind == "stream":
        fd, tmp = tempfile.mkstemp(prefix=".dtsim-out-", suffix=suffix)
        os.close(fd)
        try:
            yield tmp
            _copy_into(tmp, target, given)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return
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
    except OSError as exc:
        # a write into the temporary file names no file (``fh.write``): it is ours too
        if exc.filename in (tmp, target) or (exc.filename is None and exc.errno in _DISK):
            raise OutputPathError(f"{given}: cannot write: {exc.strerror or exc}") from None
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _copy_into(tmp: str, target: str, given: str) -> None:
    """Copy the finished temporary file into a pipe, a device or standard output."""
    try:
        with open(tmp, "rb") as src:
            if target == STDOUT:
                out = sys.stdout.buffer
                shutil.copyfileobj(src, out)
                out.flush()
                return
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
                dst.flush()
    except OSError as exc:
        raise OutputPathError(f"{given}: cannot write: {exc.strerror or exc}") from None


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
