"""Human-readable output and safe file writing for the commands."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from dtsim.cli.errors import BadInput
from simcore.units import format_bytes, format_rate, format_time
from traces.atomic import OutputPathError, check_writable, resolve_output, write_text

MIN_FREE_BYTES = 1 << 20
"""An output's filesystem must have at least this much free space (beyond what the
command knows it will write) when the command starts."""


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON, atomically."""
    write_text(path, json.dumps(data, separators=(",", ":")) + "\n")


def check_output(option: str, path: str, need_bytes: int = 0) -> None:
    """Refuse (:class:`BadInput`, exit 2, naming ``option`` and ``path``) an output file
    that cannot be written: its folder missing, read-only or refusing a new file (tried
    with a probe file, removed at once: permission bits do not stop root, but a read-only
    or special filesystem does), or with less than ``need_bytes`` plus
    :data:`MIN_FREE_BYTES` free. Commands call it before they start any work."""
    try:
        check_writable(path)
        target, kind = resolve_output(path)
    except OutputPathError as exc:
        raise BadInput(f"{option}: {exc}") from None
    if kind == "stream":
        return
    folder = os.path.dirname(os.path.abspath(target))
    _probe(option, path, folder)
    _check_space(option, path, folder, need_bytes)


def check_output_dir(option: str, path: str, need_bytes: int = 0) -> None:
    """Refuse (:class:`BadInput`, exit 2, naming ``option`` and ``path``) an output folder
    that cannot be used: a file, or inside a folder that refuses a new file, or on a
    filesystem with less than ``need_bytes`` plus :data:`MIN_FREE_BYTES` free. Nothing is
    created (a missing folder is made by the command when it writes)."""
    given = os.path.abspath(path)
    if os.path.exists(given) and not os.path.isdir(given):
        raise BadInput(f"{option}: {path}: is a file; give a folder")
    existing = given
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise BadInput(f"{option}: {path}: {existing} is a file, not a folder")
    _probe(option, path, existing)
    _check_space(option, path, existing, need_bytes)


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
"""Errors of writing that are the place's, not the program's: the user's to fix."""


@contextlib.contextmanager
def output_folder(option: str, path: str | None, *, keep_partial: bool = False) -> Iterator[None]:
    """Check output folder ``path`` of ``option`` before the work (:func:`check_output_dir`),
    and if the block fails, remove the folder when this command created it (with
    ``keep_partial``, only when nothing was written into it: a resumable command keeps
    what it finished). A write that fails for want of space or permission becomes a
    :class:`BadInput` naming the option, the folder and the file. ``None``: no folder."""
    if path is None:
        yield
        return
    check_output_dir(option, path)
    existed = os.path.exists(path)
    try:
        with output_errors(option):
            yield
    except BaseException as exc:
        if not existed and os.path.isdir(path) and not (keep_partial and _holds_files(path)):
            shutil.rmtree(path, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            name = f" ({exc.filename})" if exc.filename else ""
            raise BadInput(f"{option}: {path}: cannot write{name}: {exc.strerror or exc}") from None
        raise


@contextlib.contextmanager
def output_errors(option: str) -> Iterator[None]:
    """Within the block, a failed write of ``option``'s output
    (:class:`~traces.atomic.OutputPathError`, which names the file) names the option too."""
    try:
        yield
    except OutputPathError as exc:
        raise BadInput(f"{option}: {exc}") from None


def _holds_files(folder: str) -> bool:
    return any(files for _root, _dirs, files in os.walk(folder))


def _probe(option: str, path: str, folder: str) -> None:
    """Create and remove a file in ``folder``: the one sure test that writing there works."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".dtsim-probe-")
    except OSError as exc:
        raise BadInput(
            f"{option}: {path}: cannot write in {folder}: {exc.strerror or exc}"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _check_space(option: str, path: str, folder: str, need_bytes: int) -> None:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # not knowable here
    if free < need_bytes + MIN_FREE_BYTES:
        raise BadInput(
            f"{option}: {path}: only {format_bytes(free)} free on its filesystem"
            + (f", about {format_bytes(need_bytes)} needed" if need_bytes else "")
            + "; free some space or write elsewhere"
        )


def table(rows: list[tuple[str, str]], indent: int = 2) -> str:
    """Two aligned columns."""
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{' ' * indent}{k:<{width}}  {v}" for k, v in rows)


def run_table(r: Any) -> str:
    """The compact summary of a :class:`~simcore.result.RunResult`."""
    util = r.per_gpu_utilization
    comm_kinds = ", ".join(
        f"{k} {format_bytes(v / r.simulated_iterations)}"
        for k, v in sorted(r.comm_bytes_by_link_kind.items())
    )
    fits = "fits" if r.fits_in_memory else "DOES NOT FIT"
    cpu = getattr(r, "device_kind", "gpu") == "cpu"
    unit, dev = ("rank", "CPU") if cpu else ("GPU", "GPU")
    head = (
        f"{r.scheme} | {r.model} | {r.gpus} {unit}{'s' if r.gpus != 1 else ''} "
        f"({r.gpu_model}) | {r.topology} | {r.fidelity}"
    )
    rows = [
        (
            "iteration time",
            f"{format_time(r.iteration_time_s)}  (mean of {r.iterations} after "
            f"{r.warmup_iterations} warm-up)",
        ),
        (
            "throughput",
            f"{r.throughput_samples_s:,.1f} samples/s  (batch {r.batch_size} per "
            f"replica, {r.global_batch_size} global)",
        ),
        (
            "speedup",
            f"{r.speedup:.2f}x  over 1 {unit} at the same global batch "
            f"({format_time(r.single_gpu_time_s)})",
        ),
        (
            f"{dev} utilisation",
            f"{100 * r.gpu_utilization:.1f}%  (min {100 * min(util):.1f}%, "
            f"max {100 * max(util):.1f}%)",
        ),
        ("bubble / idle", f"{100 * r.bubble_fraction:.1f}%"),
        (
            "communication",
            f"{format_bytes(r.comm_bytes_per_iteration)} sent per iteration"
            + (f"; on links: {comm_kinds}" if comm_kinds else ""),
        ),
        (
            "peak memory",
            f"{format_bytes(r.peak_memory_bytes)} of "
            f"{format_bytes(r.memory_capacity_bytes)} per {unit} ({fits})",
        ),
        ("simulation", f"{r.events:,} events in {format_time(r.wall_s)}"),
    ]
    if r.trace_device != r.gpu_model or r.compute_scale != 1.0:
        how = (
            f"times scaled by 1/{r.compute_scale:.3g}"
            if r.compute_scale != 1.0
            else "times used as measured; --set compute_scale=X rescales them"
        )
        rows.append(("compute", f"trace measured on {r.trace_device}; {how}"))
    for k, v in r.extra.items():
        if isinstance(v, int | float | str):
            rows.append(extra_row(k, v))
    return head + "\n" + table(rows)


def extra_row(key: str, value: Any) -> tuple[str, str]:
    """A scheme extra as a table row, formatted by its unit suffix (``_s``, ``_bytes``)."""
    label = key.replace("_", " ")
    if isinstance(value, bool):
        return label, "yes" if value else "no"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key.endswith("_s"):
            return label[:-2], format_time(value)
        if key.endswith("_bytes"):
            return label[:-6], format_bytes(value)
    return label, str(value)


__all__ = ["format_rate", "run_table", "table", "write_json"]
