"""Start the ranks of a real run, watch them, and collect their records. No torch here.

:func:`launch` starts one process per rank (``python -m realrun``, see
:mod:`realrun.worker`) with the environment ``torchrun`` would give it, on this machine
(``local``: loopback) or inside the hosts of an :class:`~realrun.netns.EmulatedCluster`.
It then watches them:

* a rank that exits with an error or is killed ends the run at once: every other rank is
  stopped and :class:`RankFailed` names the rank, its role and its last error line;
* a run in which no rank has made progress for ``job.timeout_s`` seconds is hung: every
  rank is stopped and :class:`RankFailed` names the rank the others wait for, with where
  it was (iteration and phase) and its last span (from the heartbeat file). A rank that
  was stopped (SIGSTOP, a debugger) is that rank; otherwise it is the one whose main
  thread does not wait for other ranks (from the stacks the ranks dump on SIGUSR1), or
  the least advanced. A rank that has not reported yet (starting up: importing torch,
  building its model) makes progress while it uses CPU time; one that is stopped does not,
  whatever the others do. The limit is shorter than the ranks' own collective timeouts
  (four times ``timeout_s``), so the hung rank is named before a waiting rank's timeout
  fires.

Each rank carries its owner's tag (``DTSIM_RUN_OWNER``, :mod:`realrun.owner`) and stops
itself if this process is killed without cleaning up.

Every process is stopped on the way out, also on Ctrl-C and SIGTERM (the caller turns
SIGTERM into an exception; see :func:`realrun.netns.terminate_as_interrupt`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from realrun.heartbeat import HEARTBEAT_SLOT_BYTES, PHASES, read_heartbeats, read_labels
from realrun.job import Job
from realrun.owner import OWNER_ENV, owner_tag, stat_fields

POLL_S = 0.05
PHASE_WORDS = ("in its forward", "in its backward", "in its update", "between iterations")
"""Where a worker is after reporting each phase (:data:`realrun.heartbeat.PHASES`)."""


class RankFailed(RuntimeError):
    """A rank died or hung; the message is one line naming it."""

    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        super().__init__(message)


@dataclass(frozen=True)
class Placement:
    """How to start the processes of each host.

    Attributes:
        wrap: ``wrap(host, argv)`` returns the command that runs ``argv`` on ``host``
            (identity for ``local``; ``ip netns exec`` for network namespaces).
        master_addr: address of rank 0's host.
        ifname: ``ifname(host)``: the interface gloo binds to on that host.
    """

    wrap: Callable[[int, list[str]], list[str]]
    master_addr: str
    ifname: Callable[[int], str]


def local_placement() -> Placement:
    """Every rank on this machine, over loopback."""
    return Placement(lambda _h, argv: argv, "127.0.0.1", lambda _h: "lo")


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    job: Job,
    out_dir: str,
    placement: Placement | None = None,
    *,
    port: int | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run ``job`` (see module docs) with its files in ``out_dir``; returns the gathered
    records (``records.json`` of rank 0). ``on_start(started, ranks)`` is called as each
    rank starts, ``progress(iteration)`` as the slowest worker advances."""
    placement = placement or local_placement()
    os.makedirs(out_dir, exist_ok=True)
    job_path = os.path.join(out_dir, "job.json")
    job.write(job_path)
    hb_path = os.path.join(out_dir, "heartbeat")
    with open(hb_path, "wb") as fh:
        fh.write(b"\0" * HEARTBEAT_SLOT_BYTES * job.world_size)
    records_path = os.path.join(out_dir, "records.json")
    if os.path.exists(records_path):
        os.unlink(records_path)
    port = port or free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    owner = owner_tag()
    try:
        for rank in range(job.world_size):
            host = job.host_of(rank)
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(job.world_size),
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR=placement.master_addr,
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME=placement.ifname(host),
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
            )
            env[OWNER_ENV] = owner
            if job.backend == "gloo":
                env["CUDA_VISIBLE_DEVICES"] = ""
            argv = [sys.executable, "-m", "realrun", "--job", job_path, "--out", out_dir]
            log = open(os.path.join(out_dir, f"rank{rank}.log"), "wb")  # noqa: SIM115
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    placement.wrap(host, argv),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            if on_start is not None:
                on_start(rank + 1, job.world_size)
        _watch(job, procs, out_dir, hb_path, progress)
    finally:
        stop(procs)
        for log in logs:
            log.close()
    with open(records_path, encoding="utf-8") as fh:
        return json.load(fh)


def _watch(
    job: Job,
    procs: Sequence[subprocess.Popen[bytes]],
    out_dir: str,
    hb_path: str,
    progress: Callable[[int], None] | None,
) -> None:
    last_reported = -1
    spawned = time.monotonic()  # the last rank has just started
    cpu: dict[int, int] = {}  # CPU ticks of ranks that have not reported yet...
    busy_at: dict[int, float] = {}  # ...and when they last grew
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0):
                raise RankFailed(
                    rank,
                    f"rank {rank} ({job.role(rank)}) "
                    f"{_exit_reason(code)}: "
                    f"{last_error(os.path.join(out_dir, f'rank{rank}.log'))}",
                )
        if all(c == 0 for c in codes):
            return
        beats = read_heartbeats(hb_path, job.world_size)
        now = time.monotonic()
        live = [r for r, c in enumerate(codes) if c is None]
        reported = [r for r in live if beats[r][0] > 0]
        for r in live:
            if r not in reported:
                ticks = cpu_ticks(procs[r].pid)
                if ticks != cpu.get(r):
                    cpu[r], busy_at[r] = ticks, now
        stopped = [r for r in live if is_stopped(procs[r].pid)]
        # while a rank is stopped, the others' waiting (CPU of polls) is no progress
        starting = [r for r in live if r not in reported and (not stopped or r in stopped)]
        quiet_s = now - max(
            [spawned] + [beats[r][0] for r in reported] + [busy_at[r] for r in starting]
        )
        if live and quiet_s > job.timeout_s:
            raise _hang(job, procs, live, reported, stopped, beats, out_dir, hb_path, quiet_s)
        if progress is not None and job.workers:
            slowest = min(beats[r][1] for r in range(job.workers)) // PHASES
            if slowest > last_reported:
                last_reported = slowest
                progress(slowest)
        time.sleep(POLL_S)


def _hang(
    job: Job,
    procs: Sequence[subprocess.Popen[bytes]],
    live: list[int],
    reported: list[int],
    stopped: list[int],
    beats: list[tuple[float, int]],
    out_dir: str,
    hb_path: str,
    quiet_s: float,
) -> RankFailed:
    """The error naming the rank a hung run waits for (see module docs)."""
    if stopped:
        hung = stopped[0]
        how = "it was stopped (SIGSTOP or a debugger)"
    else:
        # The least advanced rank is the one the others wait for; servers only answer
        # workers, so a worker is named before a server that got as far; then the one that
        # stopped first. A rank that has not reported is the least advanced of all.
        waiting = _waiting_ranks(procs, live, out_dir)
        busy = [r for r in live if r not in waiting]

        def key(r: int) -> tuple[float, bool, float]:
            return (
                beats[r][1] if r in reported else -math.inf,
                job.role(r) != "worker",
                beats[r][0],
            )

        hung = busy[0] if len(busy) == 1 else min(busy or live, key=key)
        how = "it stopped making progress and the others wait for it"
    if hung not in reported:
        where = "starting up (before meeting the other ranks)"
    elif beats[hung][1] < 0:
        where = "before training"
    elif beats[hung][1] >= job.total_iterations * PHASES:
        where = "after training (gathering the records)"
    else:
        it, phase = divmod(beats[hung][1], PHASES)
        where = f"in iteration {it}, {PHASE_WORDS[phase] if hung < job.workers else 'serving'}"
    label = read_labels(hb_path, job.world_size)[hung] or "none yet"
    return RankFailed(
        hung,
        f"rank {hung} ({job.role(hung)}) hung: {how}; no rank made progress for "
        f"{quiet_s:.0f} s (time limit {job.timeout_s:g} s); it was {where}, last span: {label}",
    )


def cpu_ticks(pid: int) -> int:
    """CPU time process ``pid`` has used (user and system, clock ticks); -1 if gone."""
    fields = stat_fields(pid)
    return -1 if fields is None else int(fields[11]) + int(fields[12])


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T, by SIGSTOP, or t, by a tracer)."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


WAITING_FRAMES = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/",
    "realrun/runtime.py",
    "realrun/p2p.py",
    "threading.py",
)
"""Where a rank's main thread is when it waits for other ranks: in a collective, in DDP,
in backward (which waits for DDP's all-reduces), or in our message waits (the
messenger's, or a posted receive's for the pipelines and gossip)."""


def _waiting_ranks(
    procs: Sequence[subprocess.Popen[bytes]], live: list[int], out_dir: str
) -> set[int]:
    """The live ranks whose main thread waits for other ranks, from the stacks they dump
    on SIGUSR1 (see :mod:`realrun.worker`)."""
    sizes = {}
    for r in live:
        path = os.path.join(out_dir, f"rank{r}.log")
        sizes[r] = os.path.getsize(path) if os.path.exists(path) else 0
        with contextlib.suppress(ProcessLookupError):
            procs[r].send_signal(signal.SIGUSR1)
    time.sleep(1.0)
    waiting = set()
    for r in live:
        with open(os.path.join(out_dir, f"rank{r}.log"), "rb") as fh:
            fh.seek(sizes[r])
            dump = fh.read().decode("utf-8", "replace")
        if waits_for_others(dump):
            waiting.add(r)
    return waiting


def waits_for_others(dump: str) -> bool:
    """Whether a faulthandler dump shows the main thread in one of the
    :data:`WAITING_FRAMES`."""
    main = _main_thread_stack(dump)
    return any(any(w in line for w in WAITING_FRAMES) for line in main)


def _main_thread_stack(dump: str) -> list[str]:
    """The frames of the thread that handled the signal (Python's main thread) in a
    faulthandler dump."""
    lines = dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Current thread"):
            out = []
            for frame in lines[i + 1 :]:
                if not frame.startswith("  File"):
                    break
                out.append(frame)
            return out
    return []


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def last_error(log_path: str) -> str:
    """The last line of a rank's log that looks like an error (or its last line)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return "(no log)"
    if not lines:
        return "(no output)"
    for ln in reversed(lines):
        if ("Error" in ln or "Exception" in ln or ln.startswith("realrun:")) and not ln.startswith(
            ("File ", "Traceback")
        ):
            return ln[:300]
    return lines[-1][:300]


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 3.0) -> None:
    """Stop every process still running (its whole session): SIGTERM, then SIGKILL."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _signal_group(p, signal.SIGTERM)
        _signal_group(p, signal.SIGCONT)  # a stopped rank gets its SIGTERM only then
    deadline = time.monotonic() + grace_s
    for p in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(sig)
