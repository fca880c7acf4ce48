"""Start the ranks of a real run, watch them, and collect their records. No torch here.

:func:`launch` starts one process per rank (``python -m realrun``, see
:mod:`realrun.worker`) with the environment ``torchrun`` would give it, on this machine
(``local``: loopback) or inside the hosts of an :class:`~realrun.netns.EmulatedCluster`.
It then watches them:

* a rank that exits with an error or is killed ends the run at once: every other rank is
  stopped and :class:`RankFailed` names the rank, its role and its last error line;
* a run in which no rank has made progress for ``job.timeout_s`` seconds is hung: every
  rank is stopped and :class:`RankFailed` names the rank whose latest progress is the
  oldest (the others are waiting for it), with the iteration it was in.

Every process is stopped on the way out, also on Ctrl-C and SIGTERM (the caller turns
SIGTERM into an exception; see :func:`realrun.netns.terminate_as_interrupt`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from realrun.heartbeat import HEARTBEAT_SLOT_BYTES, PHASES, read_heartbeats
from realrun.job import Job

POLL_S = 0.05


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
) -> dict[str, Any]:
    """Run ``job`` (see module docs) with its files in ``out_dir``; returns the gathered
    records (``records.json`` of rank 0). ``progress(iteration)`` is called as the
    slowest worker advances."""
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
    started = time.monotonic()
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
        stamps = [beats[r][0] for r in live if beats[r][0] > 0]
        if len(stamps) == len(live) and stamps and now - max(stamps) > job.timeout_s:
            # The least advanced rank is the one the others wait for; servers only answer
            # workers, so a worker is named before a server that got as far; then the one
            # that stopped first.
            waiting = _waiting_ranks(procs, live, out_dir)
            busy = [r for r in live if r not in waiting]
            hung = (
                busy[0]
                if len(busy) == 1
                else min(
                    busy or live, key=lambda r: (beats[r][1], job.role(r) != "worker", beats[r][0])
                )
            )
            step = beats[hung][1]
            where = "before training" if step < 0 else f"in iteration {step // PHASES}"
            raise RankFailed(
                hung,
                f"rank {hung} ({job.role(hung)}) hung: no rank made "
                f"progress for {job.timeout_s:g} s and rank {hung} got "
                f"the least far ({where}); the others wait for it",
            )
        if not stamps and live and now - started > job.timeout_s * 3:
            raise RankFailed(
                live[0],
                f"rank {live[0]} ({job.role(live[0])}) hung: no rank started within the time limit",
            )
        if progress is not None and job.workers:
            slowest = min(beats[r][1] for r in range(job.workers)) // PHASES
            if slowest > last_reported:
                last_reported = slowest
                progress(slowest)
        time.sleep(POLL_S)


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
