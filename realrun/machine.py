"""What machine this is, for traces that record where they were measured.

No host name: the fingerprint says what kind of machine measured a trace (CPU model,
logical CPUs, memory, GPU), so two identical machines agree and a different one does not.
No torch here.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import platform


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s "model name", else
    :func:`platform.processor`, else the architecture)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    """Logical CPUs of this machine."""
    return os.cpu_count() or 0


def memory_bytes() -> int:
    """Physical memory of this machine (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def fingerprint(gpu: str = "") -> str:
    """A short hash of the hardware (CPU model, logical CPUs, memory rounded to GiB,
    ``gpu``), without the host name."""
    gib = round(memory_bytes() / 2**30)
    text = "|".join((cpu_model(), str(cpu_cores()), f"{gib}GiB", gpu, platform.machine()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def now_iso() -> str:
    """The current UTC date and time, ISO 8601 to the second (``2026-11-23T01:30:00+00:00``)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def trace_fields(gpu: str = "") -> dict[str, object]:
    """The :class:`traces.model.TraceMeta` fields that say where and when a trace is
    measured here: ``cpu``, ``cpu_cores``, ``gpu``, ``machine`` and ``date``."""
    return {
        "cpu": cpu_model(),
        "cpu_cores": cpu_cores(),
        "gpu": gpu,
        "machine": fingerprint(gpu),
        "date": now_iso(),
    }


MACHINE_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The machine's CPU states :func:`machine_cpu_s` reads, in /proc/stat's order."""

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def machine_cpu_s() -> list[float] | None:
    """CPU seconds the whole machine (all cores) has spent in each of
    :data:`MACHINE_STATES` since boot, or ``None`` without a readable /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 1 + len(MACHINE_STATES):
        return None
    return [int(v) * _TICK_S for v in fields[1 : 1 + len(MACHINE_STATES)]]


def busy_share(before: list[float] | None, after: list[float] | None) -> float | None:
    """The busy share of every core between two :func:`machine_cpu_s` readings (all but
    idle and iowait), or ``None`` without both or with no time between them."""
    if before is None or after is None:
        return None
    diff = [y - x for x, y in zip(before, after, strict=False)]
    total = sum(diff)
    if total <= 0:
        return None
    idle = diff[MACHINE_STATES.index("idle")] + diff[MACHINE_STATES.index("iowait")]
    return max(0.0, min(1.0, 1.0 - idle / total))
