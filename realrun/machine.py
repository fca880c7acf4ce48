"""What machine this is, for traces and calibrations that record where they were
measured, and how busy its cores are (``/proc``).

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


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy since boot (all but idle and
    iowait of :func:`machine_cpu_s`; 10 ms resolution): a shaped link's packet work runs
    in the kernel's soft interrupts, charged to whatever runs or to no process at all.
    ``OSError`` without a readable /proc/stat."""
    states = machine_cpu_s()
    if states is None:
        raise OSError("/proc/stat has no CPU line")
    return (
        sum(states) - states[MACHINE_STATES.index("idle")] - states[MACHINE_STATES.index("iowait")]
    )


def memory_total_text() -> str:
    """The machine's memory (MemTotal of /proc/meminfo) as ``parse_size`` reads it."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return f"{kib / 2**20:.3f}GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.3f}GiB"


def tcp_send_buffer_bytes() -> int:
    """The most a TCP socket's send buffer grows to here (``net.ipv4.tcp_wmem``'s maximum;
    4 MiB, Linux's default, where it cannot be read): what a blocking send hands the
    kernel before it returns."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem", encoding="ascii") as fh:
            return int(fh.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20
