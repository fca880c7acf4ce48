"""Where does the CPU of a validated case go, in the real run and in its simulation?

For each repeat of the cases of a ``sim validate`` output folder whose id starts with
the given prefix, this prints, per iteration:

- the real run (from its kept records): the machine's ``/proc/stat`` counters between
  its first and last iteration end (user, system, soft interrupts, idle, in
  core-seconds) and the processes' own CPU clocks (every rank's and server's process,
  all threads); ``beyond`` is the machine's busy time less the processes' clocks. This
  kernel has no separate IRQ time accounting, so soft interrupts that ran on top of a
  process count in that process's clock too, and its tick-based counters miss work on
  idle cores (docs/cpu_hosts.md): ``beyond`` is what the network stack did outside the
  processes, at least.
- the simulation of that repeat (once, no jitter): the core-seconds the model charged,
  by kind: a message's ends (``CommCpu.join``: per-message, per-byte and the run's
  measured messaging cost), a shaped link's packet work (``CommCpu.background``), and
  the threads' own work (compute, optimizer steps, a server's handling).

Comparing the two says whether the simulated machine does more work than the real one
and in what (docs/validation.md, twentieth session)::

    python bench/cpu_account.py validation/ p3-mlp_medium-200Mbps
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

USER, SYSTEM, IDLE, IOWAIT, SOFTIRQ = 0, 2, 3, 4, 6
"""Positions in the records' ``machine_at_end`` rows (``/proc/stat``'s cpu line)."""


def real_account(records: dict[str, Any]) -> dict[str, float]:
    """Core-seconds per iteration of a real run, between its first and last iteration
    end: ``iteration_s``, ``user``, ``system``, ``softirq``, ``idle``, ``busy`` (all but
    idle and I/O wait), ``processes`` (the processes' clocks) and ``beyond``."""
    ranks = records["ranks"]
    ends = ranks[0]["iteration_end"]
    first, last = min(ends, key=int), max(ends, key=int)
    n = int(last) - int(first)
    machine = ranks[0]["machine_at_end"]
    d = [(b - a) / n for a, b in zip(machine[first], machine[last], strict=True)]
    processes = 0.0
    for rank in ranks:
        clock = rank.get("cpu_at_end") or {}
        if first in clock and last in clock:
            processes += (clock[last] - clock[first]) / n
        elif rank.get("messenger"):  # a server: its clock over its whole life
            processes += rank["messenger"]["process_cpu_s"] / len(ends)
    busy = sum(d) - d[IDLE] - d[IOWAIT]
    return {
        "iteration_s": (ends[last] - ends[first]) / n,
        "user": d[USER],
        "system": d[SYSTEM],
        "softirq": d[SOFTIRQ],
        "idle": d[IDLE],
        "busy": busy,
        "processes": processes,
        "beyond": busy - processes,
    }


def simulated_account(config: Any) -> tuple[float, Counter[str]]:
    """Simulate ``config`` once; ``(iteration time, core-seconds charged per simulated
    iteration by kind)``. A message's end that its rank's own thread writes (a
    pipeline's ``isend``) counts with the threads: it runs on the thread's stream."""
    import simcore.host as host
    import simcore.transport as transport
    from simcore.engine import simulate

    charged: Counter[str] = Counter()
    kind = ["threads"]
    comm = transport.CommCpu
    join, background, run = comm.join, comm.background, host.CpuPool.run

    def as_kind(name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        kind[0] = name
        try:
            return fn(*args, **kwargs)
        finally:
            kind[0] = "threads"

    def counting_join(self: Any, *args: Any, **kwargs: Any) -> Any:
        count, start = join(self, *args, **kwargs)
        return count, lambda on_one: as_kind("message ends", start, on_one)

    def counting_background(self: Any, *args: Any, **kwargs: Any) -> None:
        as_kind("link work", background, self, *args, **kwargs)

    def counting_run(self: Any, work_s: float, *args: Any, **kwargs: Any) -> None:
        charged[kind[0]] += max(work_s, 0.0)
        run(self, work_s, *args, **kwargs)

    comm.join, comm.background = counting_join, counting_background
    host.CpuPool.run = counting_run
    try:
        result = simulate(config)
    finally:
        comm.join, comm.background, host.CpuPool.run = join, background, run
    n = result.simulated_iterations
    return result.iteration_time_s, Counter({k: v / n for k, v in charged.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="a sim validate output folder")
    ap.add_argument("prefix", help="cases whose id starts with this (p3-mlp_medium-200Mbps)")
    args = ap.parse_args()
    from analysis.validation.harness import kept_repeats, load_records
    from analysis.validation.replay import measured_case_config

    for row, case, k, path in kept_repeats(args.out, args.prefix):
        real = real_account(load_records(path))
        config = measured_case_config(case, args.out, k, None)
        sim_s, charged = simulated_account(config)
        print(
            f"{row.point_id} r{k}: real {real['iteration_s'] * 1e3:.0f} ms an iteration, "
            f"machine busy {real['busy']:.2f} core-s (user {real['user']:.2f}, system "
            f"{real['system']:.2f}, softirq {real['softirq']:.2f}; idle "
            f"{real['idle']:.2f}), processes {real['processes']:.2f}, beyond "
            f"{real['beyond']:+.2f}"
        )
        kinds = ("message ends", "link work", "threads")
        shares = ", ".join(f"{kind} {charged[kind]:.2f}" for kind in kinds)
        pad = " " * len(row.point_id)
        print(f"{pad}     simulated {sim_s * 1e3:.0f} ms, charged {shares} core-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
