"""The machine's CPU scheduler, measured: how much of its cores threads that compute and
sleep in turn really get when there are more of them than cores.

Processor sharing over all cores (one run queue) says that ``n`` runnable threads on
``C < n`` cores each progress at ``C / n`` and no core idles while a thread waits. Linux
keeps a run queue per core: a thread that wakes goes to an idle core if there is one,
else back to the core it last ran on, and a core that runs out of threads takes one over
from a busier core only at its next load balancing, milliseconds later. Threads that
block and wake all the time (a training step waiting for messages) leave cores idle
beside queued work (docs/cpu_hosts.md has a table of it; ``bench/scheduler.py`` reruns
it on the machine at hand).

:func:`measure` runs that benchmark (``cores + 1`` processes, each spinning
:data:`CYCLES` ``compute`` seconds of CPU time then sleeping ``sleep`` seconds, for
``duration`` seconds) and counts the cycles; :func:`simulate_cycles` runs the same on
:class:`simcore.host.CpuPool`; :func:`fit_balance` picks the load-balancing delay
(:attr:`simcore.topology.HostSpec.balance_s`) whose simulation does as many cycles.
No torch here: the benchmark processes are plain Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BALANCE_GRID_S",
    "CYCLES",
    "fit_balance",
    "measure",
    "simulate_cycles",
]

CYCLES: tuple[tuple[float, float, float], ...] = ((8e-3, 4e-3, 2.0), (40e-3, 20e-3, 3.0))
"""``(compute_s, sleep_s, duration_s)`` of each benchmark row: short cycles show where
woken threads go, long ones how soon an idle core takes over queued work."""

BALANCE_GRID_S = (0.0, 0.5e-3, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 7e-3, 8e-3, 10e-3,
                  12e-3, 16e-3, 24e-3, 32e-3, 64e-3)  # fmt: skip
"""The load-balancing delays tried by :func:`fit_balance` (0: one shared run queue)."""

SEEDS = 3
"""Simulations per row and delay in :func:`fit_balance`, their cycles averaged (each with
its own jittered sleeps)."""

SLEEP_JITTER = 0.2
"""Relative spread (uniform, total width) of the simulated sleeps: real sleeps never last
exactly as long, and identical ones lock simulated threads into one phase."""

_CHILD = r"""
import json, sys, time
compute_s, sleep_s, start, stop = (float(a) for a in sys.argv[1:5])
time.sleep(max(0.0, start - time.monotonic()))
def waited():
    try:
        with open("/proc/thread-self/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
cycles, slept, w0 = 0, 0.0, waited()
while time.monotonic() < stop:
    t0 = time.thread_time()
    while time.thread_time() - t0 < compute_s:
        pass
    s0 = time.monotonic()
    time.sleep(sleep_s)
    slept += time.monotonic() - s0
    cycles += 1
out = {"cycles": cycles, "sleep_s": slept / max(cycles, 1), "run_wait_s": waited() - w0}
print(json.dumps(out))
"""


def measure(
    cores: int | None = None,
    cycles: Sequence[tuple[float, float, float]] = CYCLES,
    processes: int | None = None,
) -> list[dict[str, float]]:
    """Run the benchmark on this machine: per row of ``cycles``, ``processes`` processes
    (default ``cores + 1``; ``cores``: the cores this process may use) start together and
    each computes and sleeps in turn until the row's duration is over. Returns per row
    the processes, the cycles they did in all, the mean time a sleep really took, and the
    time a cycle spent waiting in a run queue (``/proc/<pid>/schedstat``; 0 where the
    kernel does not keep it)."""
    n = processes or (cores or len(os.sched_getaffinity(0))) + 1
    rows = []
    for compute_s, sleep_s, duration_s in cycles:
        start = time.monotonic() + 0.3  # every process started and waiting by then
        stop = start + duration_s
        argv = [sys.executable, "-c", _CHILD, repr(compute_s), repr(sleep_s), repr(start),
                repr(stop)]  # fmt: skip
        procs: list[subprocess.Popen[str]] = []
        outs = []
        try:
            for _ in range(n):
                procs.append(
                    subprocess.Popen(
                        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    )
                )
            for p in procs:
                out, err = p.communicate(timeout=duration_s + 60)
                if p.returncode != 0:
                    raise RuntimeError(f"scheduler benchmark process failed: {err.strip()[-300:]}")
                outs.append(json.loads(out))
        finally:  # on any way out, no benchmark process is left spinning
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        done = sum(int(o["cycles"]) for o in outs)
        rows.append(
            {
                "processes": n,
                "compute_s": compute_s,
                "sleep_s": sleep_s,
                "duration_s": duration_s,
                "cycles": done,
                "slept_s": sum(o["sleep_s"] for o in outs) / n,
                "run_wait_s": sum(o["run_wait_s"] for o in outs) / max(done, 1),
            }
        )
    return rows


def simulate_cycles(row: Mapping[str, Any], cores: int, balance_s: float, seed: int = 0) -> int:
    """How many cycles the benchmark ``row`` does on :class:`~simcore.host.CpuPool` with
    ``cores`` cores and load-balancing delay ``balance_s``: each process a thread that
    computes ``compute_s`` and sleeps ``slept_s`` (jittered by :data:`SLEEP_JITTER`) in
    turn; a cycle counts when its sleep ends before ``duration_s``, as the real loop
    checks the clock after each sleep."""
    import numpy as np
    from simpy import Environment

    from simcore.host import CpuPool

    env = Environment()
    pool = CpuPool(env, cores, balance_s)
    rng = np.random.default_rng(seed)
    compute_s = float(row["compute_s"])
    sleep_s = float(row.get("slept_s", row["sleep_s"]))
    stop = float(row["duration_s"])
    count = [0]

    def cycle(thread: int) -> None:
        pool.run(compute_s, lambda: sleep(thread), holds=True, thread=thread)

    def sleep(thread: int) -> None:
        nap = sleep_s * (1.0 + SLEEP_JITTER * (rng.random() - 0.5))
        ev = env.timeout(nap)
        ev.callbacks.append(lambda _e: woke(thread))

    def woke(thread: int) -> None:
        if env.now <= stop:
            count[0] += 1
            cycle(thread)

    for thread in range(int(row["processes"])):
        cycle(thread)
    env.run(until=stop + sleep_s * 2)
    return count[0]


def fit_balance(rows: Sequence[Mapping[str, Any]], cores: int) -> tuple[float, float]:
    """``(balance_s, residual_rel_max)``: the delay of :data:`BALANCE_GRID_S` whose
    simulated benchmark (mean of :data:`SEEDS` simulations) does as many cycles as the
    measured ``rows`` (least squares of the relative differences), and the largest
    relative difference left."""
    rows = [r for r in rows if int(r["cycles"]) > 0]
    if not rows:
        raise ValueError("the scheduler benchmark did no cycles")
    best: tuple[float, float, float] | None = None
    for balance in BALANCE_GRID_S:
        errs = [
            sum(simulate_cycles(r, cores, balance, seed) for seed in range(SEEDS))
            / SEEDS
            / int(r["cycles"])
            - 1.0
            for r in rows
        ]
        cost = sum(e * e for e in errs)
        if best is None or cost < best[0] - 1e-12:
            best = (cost, balance, max(abs(e) for e in errs))
    assert best is not None
    return best[1], best[2]
