"""Who owns what a real run leaves on the machine, and removing what dead runs left.
No torch here.

A run's owner is the process that starts it (``sim real``, ``sim calibrate``, ``sim
validate``), named by its *tag*, ``PID-STARTTICKS``: the pid and the process's start time
in clock ticks since boot, so a reused pid is not mistaken for the owner. Everything a run
puts on the machine carries the tag:

* its network namespaces: ``PREFIX-TAG-TOKEN-ROLE`` (:mod:`realrun.netns`);
* its temporary folders: ``dtsim-KIND-TAG-RANDOM`` in the temporary directory;
* its rank processes: ``DTSIM_RUN_OWNER=TAG`` in their environment; a rank whose owner is
  gone stops itself within a second (:func:`watch_owner`).

When the owner dies without cleaning up (``kill -9``, a crash), :func:`realrun.stale.remove_stale`
removes what carries its tag: namespaces (and the processes inside), rank processes and
temporary folders. Only what belongs to owners that are gone is touched, so runs in
progress (another user's, another test's) are safe.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

OWNER_ENV = "DTSIM_RUN_OWNER"
"""Environment variable naming a rank process's owner (its tag)."""
TEMP_KINDS = ("real", "calibrate", "linkcpu", "validate", "profile")
"""The ``KIND`` of the temporary folders that carry their owner's tag."""
_TEMP_RE = re.compile(rf"^dtsim-({'|'.join(TEMP_KINDS)})-(\d+)-(\d+)-")
WATCH_INTERVAL_S = 0.5
"""How often a rank checks that its owner is alive."""


def stat_fields(pid: int) -> list[str] | None:
    """Fields 3 and on of ``/proc/PID/stat`` (state, ppid, ...: index ``i`` is field
    ``i + 3``), or None if the process does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces
    return stat[stat.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or
    None if it does not exist. With the pid it names one process even if pids are reused."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def owner_tag(pid: int | None = None) -> str:
    """``PID-STARTTICKS`` of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid) or 0}"


def alive(pid: int, ticks: int) -> bool:
    """Whether the process that had ``pid`` and started at ``ticks`` still runs (a zombie
    counts as gone)."""
    fields = stat_fields(pid)
    return fields is not None and int(fields[19]) == ticks and fields[0] != "Z"


def tag_alive(tag: str) -> bool:
    """Whether the owner named by ``tag`` (``PID-STARTTICKS``) still runs; a malformed tag
    counts as alive (never clean up what cannot be told)."""
    m = re.fullmatch(r"(\d+)-(\d+)", tag.strip())
    return True if m is None else alive(int(m.group(1)), int(m.group(2)))


def temp_prefix(kind: str) -> str:
    """The name prefix ``dtsim-KIND-TAG-`` of this process's temporary folders."""
    assert kind in TEMP_KINDS, kind
    return f"dtsim-{kind}-{owner_tag()}-"


def temp_dir(kind: str) -> str:
    """A new temporary folder ``dtsim-KIND-TAG-RANDOM`` owned by this process."""
    return tempfile.mkdtemp(prefix=temp_prefix(kind))


def watch_owner(tag: str | None, on_gone: Callable[[], None]) -> threading.Thread | None:
    """Start a daemon thread that calls ``on_gone`` once the owner ``tag`` is gone
    (checked every :data:`WATCH_INTERVAL_S`); nothing without a tag (a rank started by
    torchrun)."""
    if not tag:
        return None

    def watch() -> None:
        while tag_alive(tag):
            time.sleep(WATCH_INTERVAL_S)
        on_gone()

    t = threading.Thread(target=watch, name="dtsim-owner-watch", daemon=True)
    t.start()
    return t


@dataclass
class Removed:
    """What :func:`realrun.stale.remove_stale` removed, and whose it was."""

    namespaces: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    owners: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.processes or self.folders)

    def describe(self) -> str:
        """One line: what was removed and which dead owners it belonged to."""
        parts = []
        for items, word in (
            (self.namespaces, "network namespace"),
            (self.processes, "rank process"),
            (self.folders, "temporary folder"),
        ):
            if items:
                parts.append(f"{len(items)} {word}{'s' if len(items) != 1 else ''}")
        pids = sorted({int(t.split("-")[0]) for t in self.owners})
        whose = ", ".join(map(str, pids))
        return (
            f"removed what {'a dead run' if len(pids) == 1 else 'dead runs'} "
            f"(pid {whose}) left: {', '.join(parts)}"
        )


def stale_processes() -> dict[int, str]:
    """Processes whose environment names an owner that is gone: pid -> owner tag."""
    out = {}
    me = os.getpid()
    needle = (OWNER_ENV + "=").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        for var in env.split(b"\0"):
            if var.startswith(needle):
                tag = var[len(needle) :].decode(errors="replace")
                if not tag_alive(tag):
                    out[int(entry)] = tag
                break
    return out


def kill_all(pids: list[int], grace_s: float = 1.0) -> None:
    """SIGKILL ``pids`` (a rank whose owner is gone has nothing worth saving) and wait up
    to ``grace_s`` for them to go."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    ticks = {p: start_ticks(p) for p in pids}
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(
        t is not None and alive(p, t) for p, t in ticks.items()
    ):
        time.sleep(0.02)


def stale_folders(tmp: str) -> dict[str, str]:
    """Temporary folders in ``tmp`` whose owner is gone: path -> owner tag."""
    out = {}
    try:
        names = os.listdir(tmp)
    except OSError:
        return out
    for name in names:
        m = _TEMP_RE.match(name)
        if m and not alive(int(m.group(2)), int(m.group(3))):
            out[os.path.join(tmp, name)] = f"{m.group(2)}-{m.group(3)}"
    return out
