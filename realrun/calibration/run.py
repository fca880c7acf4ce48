"""Running a calibration: :func:`calibrate` starts the ranks of
:mod:`realrun.calibration.ranks` on loopback or an emulated cluster, one per host, follows
their progress phase by phase (the links shaped in place between phases), runs the
scheduler, link CPU and concurrent-flow benchmarks beside them, and fits what they
measured into a preset (:func:`realrun.calibration.preset.make_preset`); a measurement
that cannot be fitted is taken once more.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from realrun import flows, linkcpu, scheduler
from realrun.calibrated import TCP_PAYLOAD_BYTES
from realrun.calibration import CalibrationError, KiB, MiB
from realrun.calibration.preset import make_preset
from realrun.calibration.ranks import (
    MESSENGER_SIZES_BYTES,
    SHAPE_LINE,
    SHAPED_FILE,
    SHARING_BYTES,
    SHARING_DELAYS,
    element_count,
)
from realrun.guard import machine_cores
from realrun.owner import temp_dir

__all__ = ["DEFAULT_ALLREDUCE_RANKS", "DEFAULT_SIZES_BYTES", "calibrate", "sharing_delays_s"]

#: Message sizes of the ping-pong and all-reduce benchmarks: 4 B to 16 MiB.
DEFAULT_SIZES_BYTES: tuple[int, ...] = (
    4,
    64,
    1 * KiB,
    16 * KiB,
    64 * KiB,
    256 * KiB,
    1 * MiB,
    4 * MiB,
    16 * MiB,
)
DEFAULT_ALLREDUCE_RANKS: tuple[int, ...] = (2, 3, 4)
#: Seconds a benchmark phase may go without reporting progress before it counts as hung
#: (each size and benchmark reports; slow links make whole phases far longer than this).
PHASE_TIMEOUT_S = 300.0


def sharing_delays_s(rate_bytes_per_s: float) -> list[float]:
    """The two-flow benchmark's delays on a link shaped to ``rate_bytes_per_s``: shares
    (:data:`SHARING_DELAYS`) of a :data:`SHARING_BYTES` message's time at the TCP goodput
    of that rate."""
    from realrun.netns import FRAME_BYTES

    alone = SHARING_BYTES / (rate_bytes_per_s * TCP_PAYLOAD_BYTES / FRAME_BYTES)
    return [f * alone for f in SHARING_DELAYS]


def _check_args(
    cluster: str,
    bandwidth_bytes_per_s: float | None,
    hosts: int,
    sizes_bytes: Sequence[int],
    repeats: int,
    allreduce_ranks: Sequence[int],
) -> None:
    """``ValueError`` naming the first bad argument and what is allowed."""
    if cluster not in ("netns", "local"):
        raise ValueError(f"cluster: {cluster!r} is not allowed; choose one of: netns, local")
    if bandwidth_bytes_per_s is not None:
        if cluster == "local":
            raise ValueError(
                "bandwidth: a local calibration runs on unshaped loopback; give a bandwidth "
                "only with cluster netns"
            )
        if not (bandwidth_bytes_per_s > 0 and math.isfinite(bandwidth_bytes_per_s)):
            raise ValueError(
                f"bandwidth: {bandwidth_bytes_per_s!r} is not allowed; it must be a positive, "
                "finite rate"
            )
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 2 <= hosts <= 64:
        raise ValueError(f"hosts: {hosts!r} is not allowed; it must be an integer from 2 to 64")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise ValueError(
            f"repeats: {repeats!r} is not allowed; it must be an integer from 1 to 1000"
        )
    sizes = list(sizes_bytes)
    if len({max(4, 4 * (int(s) // 4)) for s in sizes}) < 2 or any(
        isinstance(s, bool) or int(s) != s or not 1 <= s <= 1 << 30 for s in sizes
    ):
        raise ValueError(
            f"sizes: {sizes!r} is not allowed; give at least two different whole sizes "
            "from 4 bytes to 1 GiB"
        )
    ranks = list(allreduce_ranks)
    if any(isinstance(p, bool) or not isinstance(p, int) or not 2 <= p <= 64 for p in ranks):
        raise ValueError(
            f"allreduce_ranks: {ranks!r} is not allowed; give integers from 2 to 64 (or none)"
        )


def _run_phase(
    job: Mapping[str, Any],
    world: int,
    wrap: Callable[[int, list[str]], list[str]],
    master_addr: str,
    ifname: Callable[[int], str],
    out_dir: str,
    tick: Callable[[str], None],
    reshape: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Start ``world`` ranks of ``python -m realrun.calibration.ranks`` (rank ``r`` on host ``r``),
    follow rank 0's progress lines, and return every rank's results. At the job's
    ``shape`` step the ranks wait while ``reshape()`` shapes the links."""
    from realrun.launch import RankFailed, free_port, last_error, stop

    os.makedirs(out_dir, exist_ok=True)
    job_path = os.path.join(out_dir, "job.json")
    with open(job_path, "w", encoding="utf-8") as fh:
        json.dump({**job, "out": out_dir}, fh)
    progress_path = os.path.join(out_dir, "progress")
    open(progress_path, "w").close()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME=ifname(rank),
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
                CUDA_VISIBLE_DEVICES="",
            )
            log = open(os.path.join(out_dir, f"rank{rank}.log"), "wb")  # noqa: SIM115
            logs.append(log)
            argv = [sys.executable, "-m", "realrun.calibration.ranks", job_path]
            procs.append(
                subprocess.Popen(
                    wrap(rank, argv),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        seen = 0
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            codes = [p.poll() for p in procs]
            with open(progress_path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            for line in lines[seen:]:
                if line == SHAPE_LINE:
                    if reshape is not None:
                        reshape()
                    open(os.path.join(out_dir, SHAPED_FILE), "w").close()
                else:
                    tick(line)
            if len(lines) > seen:
                deadline = time.monotonic() + PHASE_TIMEOUT_S
            seen = max(seen, len(lines))
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    raise RankFailed(
                        rank,
                        f"calibration rank {rank} exited with code {code}: "
                        f"{last_error(os.path.join(out_dir, f'rank{rank}.log'))}",
                    )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise RankFailed(
                    0, f"calibration ranks reported no progress for {PHASE_TIMEOUT_S:g} s"
                )
            time.sleep(0.05)
    finally:
        stop(procs)
        for log in logs:
            log.close()
    results = []
    for rank in range(world):
        with open(os.path.join(out_dir, f"result{rank}.json"), encoding="utf-8") as fh:
            results.append(json.load(fh))
    return results


def _steps(job: Mapping[str, Any]) -> int:
    """Progress lines rank 0 writes for ``job``."""
    n = len(job["sizes"])
    count = {
        "pingpong": n * len(job["pairs"]),
        "allreduce": n * len(job["allreduce_ranks"]),
        "compute": 3,
        "shape": 0,
        "messenger": len(MESSENGER_SIZES_BYTES),
        "isend": len(MESSENGER_SIZES_BYTES),
        "sharing": 1,
        "wakeup": 1,
    }
    return sum(count[step.split(":")[0]] for step in job["steps"])


def _in_cluster(
    cluster: str,
    rate: float | None,
    hosts: int,
    job: Mapping[str, Any],
    out_dir: str,
    tick: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``job`` on ``hosts`` hosts: loopback (``local``) or an emulated cluster built
    unshaped and shaped to ``rate`` at the job's ``shape`` step (removed again on every way
    out). Returns the ranks' results and, for a shaped cluster, the tbf counters."""
    if cluster == "local":
        res = _run_phase(job, hosts, lambda _h, argv: argv, "127.0.0.1", lambda _h: "lo",
                         out_dir, tick)  # fmt: skip
        return res, []
    from realrun.netns import EmulatedCluster, terminate_as_interrupt

    prefix = os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
    with terminate_as_interrupt(), EmulatedCluster(hosts, None, prefix=prefix) as emu:
        res = _run_phase(
            job,
            hosts,
            emu.command,
            emu.hosts[0].address,
            lambda h: emu.hosts[h].ifname,
            out_dir,
            tick,
            lambda: emu.set_rate(rate),
        )
        return res, emu.qdisc_stats() if rate is not None else []


def calibrate(
    cluster: str = "netns",
    bandwidth_bytes_per_s: float | None = None,
    hosts: int = 2,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 5,
    allreduce_ranks: Sequence[int] = DEFAULT_ALLREDUCE_RANKS,
    progress: Callable[[int, int, str], None] | None = None,
    flow_hosts: int = flows.HOSTS,
) -> dict[str, Any]:
    """Calibrate the simulator on this machine's cluster; returns the preset mapping (see
    the module docs and docs/emulated_cluster.md for the schema).

    ``cluster``: ``netns`` (one network namespace per host, root needed; links shaped to
    ``bandwidth_bytes_per_s`` in each direction, unshaped when None) or ``local`` (loopback,
    no bandwidth). ``hosts``: the ping-pong runs between host 0 and each of hosts 1 ..
    hosts-1. ``sizes_bytes``: message sizes (rounded down to whole float32 elements).
    ``repeats``: timed repetitions per size after one warm-up. ``allreduce_ranks``: the
    all-reduce is timed on the first ``p`` hosts for each ``p``. ``progress(done, total,
    what)`` is called as benchmarks finish. ``flow_hosts``: hosts that send at once in the
    concurrent-flow benchmark (shaped links only, :mod:`realrun.flows`).

    Raises ``ValueError`` for a bad argument (naming it), ``NetnsUnavailable`` when netns
    cannot be used here, ``RankFailed`` when a benchmark process fails, and
    :class:`CalibrationError` when the measurements cannot be fitted twice in a row (a
    measurement that cannot be fitted is taken once more)."""
    _check_args(cluster, bandwidth_bytes_per_s, hosts, sizes_bytes, repeats, allreduce_ranks)
    if isinstance(flow_hosts, bool) or not isinstance(flow_hosts, int) or not 2 <= flow_hosts <= 64:
        raise ValueError(
            f"flow_hosts: {flow_hosts!r} is not allowed; it must be an integer from 2 to 64"
        )
    if cluster == "netns":
        from realrun.netns import check_available

        check_available()
    sizes = sorted({4 * element_count(int(s)) for s in sizes_bytes})
    ar_ranks = sorted(set(allreduce_ranks))
    world = max([hosts, *ar_ranks])
    shaped = cluster == "netns" and bandwidth_bytes_per_s is not None
    # one set of processes on one cluster: unshaped first (ping-pong with CPU times, the
    # compute benchmarks while the other ranks wait), then shaped where a rate is given
    # (the messenger's CPU is taken unshaped: over a shaped link its threads also burn
    # CPU while a message is in flight, which does not carry over to a training run's
    # many messages at once; the shaped link's own cost per byte is the preset's)
    # (the busy-cores all-reduce too: how long a woken thread waits for a core is the
    # machine's scheduler, measured where the link adds least; beside busy cores a
    # 200 Mbit/s link also slows for its soft interrupts, which is not a wait)
    steps = ["pingpong:unshaped", "compute", "wakeup"]
    steps += ["messenger:unshaped", "shape", "pingpong:shaped", "sharing"] if shaped else []
    steps += ["messenger:idle", "messenger:busy", "isend", "allreduce"]
    job = {
        "sizes": sizes,
        "repeats": repeats,
        "pairs": [[0, h] for h in range(1, hosts)],
        "allreduce_ranks": ar_ranks,
        "steps": steps,
        "sharing_delays_s": sharing_delays_s(bandwidth_bytes_per_s) if shaped else [],
    }
    # and the scheduler benchmark, first; the link's CPU and the concurrent flows, shaped
    total = _steps(job) + 1 + 2 * shaped
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, what)

    # A busy machine can leave a benchmark without the trend its fit needs (message times
    # that do not grow with the size): measure once more before giving up.
    def measure_and_fit() -> dict[str, Any]:
        started = datetime.datetime.now(datetime.UTC)
        t0 = time.monotonic()
        sched_rows, results, qdiscs, link_row, flow_rows = _measure(
            cluster, bandwidth_bytes_per_s if shaped else None, world, job, tick, flow_hosts
        )
        return make_preset(
            cluster=cluster,
            rate=bandwidth_bytes_per_s,
            hosts=world,
            sizes=sizes,
            repeats=repeats,
            results=results,
            qdiscs=qdiscs,
            started=started,
            wall_s=time.monotonic() - t0,
            scheduler_rows=sched_rows,
            link_row=link_row,
            flow_rows=flow_rows,
        )

    try:
        return measure_and_fit()
    except CalibrationError:
        return measure_and_fit()


def _measure(
    cluster: str,
    rate: float | None,
    world: int,
    job: Mapping[str, Any],
    tick: Callable[[str], None],
    flow_hosts: int = flows.HOSTS,
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]], Any, Any]:
    """Run every benchmark of a calibration once: ``(scheduler rows, the ranks' results,
    qdisc counters, the shaped link's CPU row or None, the concurrent flows' rounds or
    None)``; ``rate`` None: unshaped."""
    # the machine's scheduler, on its own before any rank starts (plain processes)
    try:
        sched_rows = scheduler.measure(machine_cores())
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
        raise CalibrationError(f"the scheduler benchmark failed: {err}") from None
    tick("scheduler benchmark")
    work = temp_dir("calibrate")
    try:
        results, qdiscs = _in_cluster(cluster, rate, world, dict(job), work, tick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    link_row = flow_rows = None
    if rate is not None:  # the shaped link's packet work beside computing processes
        try:
            link_row = linkcpu.measure(
                float(rate),
                machine_cores(),
                prefix=os.environ.get("DTSIM_NETNS_PREFIX", "dtsim") + "l",
            )
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
            raise CalibrationError(f"the link CPU benchmark failed: {err}") from None
        tick("link CPU benchmark")
        try:  # how evenly flows share the links when every host sends at once
            flow_rows = flows.measure(
                [float(rate) * f for f in flows.RATE_FRACTIONS],
                flow_hosts,
                flows.ROUNDS,
                prefix=os.environ.get("DTSIM_NETNS_PREFIX", "dtsim") + "f",
            )
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
            raise CalibrationError(f"the concurrent-flow benchmark failed: {err}") from None
        tick("concurrent flows")
    return sched_rows, results, qdiscs, link_row, flow_rows
