"""What this machine says about itself: its CPU, memory and cores, how busy its cores have
been, and how large a TCP socket's send buffer grows (``/proc``; the calibration's
records of where it ran)."""

from __future__ import annotations

import os
import platform

__all__ = [
    "core_count",
    "cpu_model",
    "machine_busy_s",
    "memory_total_text",
    "tcp_send_buffer_bytes",
]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


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


def core_count() -> int:
    """The cores this process may run on (its CPU affinity)."""
    return len(os.sched_getaffinity(0))


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy since boot (``/proc/stat``,
    all but idle and iowait; 10 ms resolution): a shaped link's packet work runs in the
    kernel's soft interrupts, charged to whatever runs or to no process at all."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tcp_send_buffer_bytes() -> int:
    """The most a TCP socket's send buffer grows to here (``net.ipv4.tcp_wmem``'s maximum;
    4 MiB, Linux's default, where it cannot be read): what a blocking send hands the
    kernel before it returns."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem", encoding="ascii") as fh:
            return int(fh.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20
