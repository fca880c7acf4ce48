"""What a shaped link's packet work takes from computing threads, measured.

A ``tc tbf`` link holds packets to its rate and releases them from a timer, one or a few
at a time, in the kernel's soft interrupts; the receiving end handles each frame there
too. No process is charged for that work, and the machine's busy counters (kept in
scheduler ticks, which stop on idle cores) barely see it; but it runs on the same cores
as the ranks. This module measures it as the CPU that computing processes lose while
two ranks exchange at the link's rate, beyond the ranks' own CPU time, per byte and end
(docs/cpu_hosts.md has the values measured at 200 Mbit/s and 1 Gbit/s).

The work need not grow in step with the bytes (at a low rate two pairs of hosts
exchanging at once cost less per byte than one pair), so the benchmark measures both
loads.

:func:`measure` runs it on a four-host emulated cluster: ``cores`` spinning processes
(plain Python, counting loops) alone, then beside one pair of gloo ranks that exchange
1 MiB messages both ways for ``duration_s``, then alone, then beside two such pairs,
then alone again; the spinners' lost throughput, in cores, less the ranks' own CPU
clocks (the processes' share, which the preset's per-message and per-byte costs stand
for), per byte carried, is the link's cost at that load.
:func:`link_cpu_s_per_byte` turns a row into
:attr:`simcore.topology.HostSpec.link_cpu_s_per_byte` (one pair) or
``link_cpu_two_pairs_s_per_byte`` (two pairs), per byte at each end: half of it.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from realrun.owner import temp_dir

__all__ = ["MESSAGE_BYTES", "ROUNDS", "link_cpu_s_per_byte", "measure"]

MESSAGE_BYTES = 1 << 20
"""Size of the messages the two ranks exchange (each way at once, back to back)."""

ROUNDS = 7
"""Rounds of the benchmark; the median round's cost is kept. The spinners wait for the
ranks to be exchanging (:data:`WARM_MESSAGES`), so the ranks' start-up never falls inside
a round."""

PORT = 29533
"""The rendezvous port of the two ranks, inside the benchmark's own namespaces."""

_SPINNER = r"""
import sys, time
stop = float(sys.argv[1])
n = 0
t0 = time.monotonic()
while time.monotonic() < stop:
    for _ in range(2000):
        pass
    n += 1
print(n / (time.monotonic() - t0))
"""

_RANK = r"""
import os, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, nbytes, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
go_path, stop_path, warm = sys.argv[5], sys.argv[6], int(sys.argv[7])
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://{addr}:{port}")
peer = 1 - rank
out, into = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
flags = torch.zeros(2)
dist.barrier()
n, n0, c0, t0 = 0, None, 0.0, 0.0
while True:
    r = dist.irecv(into, peer)
    s = dist.isend(out, peer)
    r.wait()
    s.wait()
    n += 1
    if n == warm:
        print("ready", flush=True)
    flags[0], flags[1] = os.path.exists(go_path), os.path.exists(stop_path)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if n0 is None and flags[0] > 0:
        n0, c0, t0 = n, time.process_time(), time.monotonic()
    if flags[1] > 0:
        break
cpu, wall = time.process_time() - c0, time.monotonic() - t0
dist.barrier()
if n0 is not None:
    print(n - n0, nbytes * (n - n0), cpu, wall, flush=True)
dist.destroy_process_group()
"""

WARM_MESSAGES = 3
"""Exchanges each rank makes before it reports ready; the spinners start (and the ranks'
clocks with them) only once every rank has: starting a rank (importing torch, joining
its group) takes a core for a second or more, four of them on two cores longer than
that, and it must not count as the link's work."""

READY_TIMEOUT_S = 120.0
"""How long the ranks may take to report ready."""


def _spin(cores: int, seconds: float) -> float:
    """Loops per second of ``cores`` spinning processes together, over ``seconds``."""
    stop = time.monotonic() + seconds
    procs = [
        subprocess.Popen([sys.executable, "-c", _SPINNER, repr(stop)], stdout=subprocess.PIPE,
                         text=True)
        for _ in range(cores)
    ]  # fmt: skip
    try:
        return sum(float(p.communicate(timeout=seconds + 30)[0]) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def measure(
    rate_bytes_per_s: float,
    cores: int,
    duration_s: float = 2.0,
    prefix: str = "dtlcpu",
    rounds: int = ROUNDS,
) -> dict[str, Any]:
    """The benchmark (module docs) on links shaped to ``rate_bytes_per_s``, ``rounds``
    times over (spinners alone before, between and after the exchanges), and the row of
    the round whose cost per byte (:func:`link_cpu_s_per_byte`) is the median. The
    cluster has four hosts, and each round runs one pair exchanging and then two pairs
    at once; the median of the two-pair rounds is the row's ``two_pairs``, a row of the
    same keys.

    The row: ``spin_idle`` and ``spin_busy`` (loops per second of all spinners, alone
    around the round and beside its exchange), ``lost_cores``, ``ranks_cores`` (their
    CPU over the exchange), ``bytes`` (carried, both ways), ``seconds`` (the
    exchange's), ``rate``, and ``rounds``: every round's ``[lost_cores, ranks_cores,
    bytes, seconds]``. Root and network namespaces needed."""
    from realrun.netns import EmulatedCluster, terminate_as_interrupt

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    share = min(cores, os.cpu_count() or cores)
    loads: list[tuple[tuple[int, int], ...]] = [((0, 1),), ((0, 1), (2, 3))]
    rows: dict[int, list[dict[str, Any]]] = {len(p): [] for p in loads}
    with terminate_as_interrupt(), EmulatedCluster(4, rate_bytes_per_s, prefix=prefix) as emu:
        idle_before = _spin(cores, duration_s)
        for _ in range(rounds):
            for pairs in loads:
                busy, outs = _exchange(emu, cores, duration_s, pairs)
                idle_after = _spin(cores, duration_s)
                idle = (idle_before + idle_after) / 2
                seconds = max(o[3] for o in outs)
                rows[len(pairs)].append(
                    {
                        "rate": rate_bytes_per_s,
                        "spin_idle": idle,
                        "spin_busy": busy,
                        "lost_cores": max(0.0, (idle - busy) / idle * share),
                        "ranks_cores": sum(o[2] for o in outs) / seconds,
                        "bytes": sum(o[1] for o in outs),
                        "seconds": seconds,
                    }
                )
                idle_before = idle_after
    row = _median_row(rows[1])
    row["two_pairs"] = _median_row(rows[2])
    return row


def _median_row(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The row of ``rows`` whose cost per byte is the median (the lower of the middle
    two), with ``rounds``: every row's ``[lost_cores, ranks_cores, bytes, seconds]``."""
    ranked = sorted(rows, key=link_cpu_s_per_byte)
    row = dict(ranked[(len(ranked) - 1) // 2])
    row["rounds"] = [[r["lost_cores"], r["ranks_cores"], r["bytes"], r["seconds"]] for r in rows]
    return row


def _exchange(
    emu: Any, cores: int, duration_s: float, pairs: Sequence[tuple[int, int]] = ((0, 1),)
) -> tuple[float, list[list[float]]]:
    """One round: each pair of ``emu``'s hosts exchanges (pair ``k`` meets at the first
    host's address on port ``PORT + k``); once every rank has warmed up and reported
    ready, ``cores`` spinners run for ``duration_s`` while the ranks count what they
    carry, then the ranks stop. ``(spinners' loops per second, each rank's [messages,
    bytes, CPU seconds, wall seconds] over the spinners' run)``, the ranks in the pairs'
    order."""
    work = temp_dir("linkcpu")
    go, stop = os.path.join(work, "go"), os.path.join(work, "stop")
    procs = []
    try:
        for k, (a, b) in enumerate(pairs):
            for rank, h in enumerate((a, b)):
                env = {**os.environ, "GLOO_SOCKET_IFNAME": emu.hosts[h].ifname}
                argv = [sys.executable, "-c", _RANK, str(rank), str(MESSAGE_BYTES),
                        emu.hosts[a].address, str(PORT + k), go, stop,
                        str(WARM_MESSAGES)]  # fmt: skip
                procs.append(subprocess.Popen(emu.command(h, argv), env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))  # fmt: skip
        _wait_ready(procs)
        open(go, "w").close()
        busy = _spin(cores, duration_s)
        open(stop, "w").close()
        outs = []
        for h, p in enumerate(procs):
            out, err = p.communicate(timeout=60)
            fields = out.split()
            if len(fields) != 4:  # (gloo may abort at exit once the numbers are out)
                raise RuntimeError(f"its rank {h} gave no result ({_last_words(p, err)})")
            outs.append([float(v) for v in fields])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    return busy, outs


def _wait_ready(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Wait for every rank's ``ready`` line (:data:`READY_TIMEOUT_S` in all)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for h, p in enumerate(procs):
        left = deadline - time.monotonic()
        assert p.stdout is not None
        if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
            raise RuntimeError(f"its rank {h} was not ready after {READY_TIMEOUT_S:g} s")
        if p.stdout.readline().strip() != "ready":
            p.wait(timeout=30)
            raise RuntimeError(f"its rank {h} stopped ({_last_words(p, p.stderr.read())})")


def _last_words(p: subprocess.Popen[str], err: str | None) -> str:
    """A rank's last line of errors, or its exit status; with a hint."""
    tail = (err or "").strip().splitlines()[-1:] or [f"exit status {p.returncode}"]
    hint = "a busy machine or a stale namespace can cause this: run the calibration again"
    return f"{tail[0]}; {hint}"


def link_cpu_s_per_byte(row: Mapping[str, Any]) -> float:
    """CPU seconds per byte, at each end, that the link's packet work took from the
    spinners beyond the ranks' own CPU (0 when none showed)."""
    lost = float(row["lost_cores"]) - float(row["ranks_cores"])
    carried = float(row["bytes"]) / float(row["seconds"])
    return max(0.0, lost / carried / 2) if carried > 0 else 0.0
