"""This machine's scheduler against the simulator's two ways of sharing cores.

Runs the scheduler benchmark of ``sim calibrate`` (``realrun.scheduler``: N plain
processes, each computing C ms of CPU time then sleeping S ms, in turn) over a table of
rows and prints, per row, the share of the cores left idle (from the cycles done: idle =
1 - cycles x C / (cores x duration)) and the run-queue wait per cycle as measured, and
the idle share :class:`simcore.host.CpuPool` gives with per-core queues (the load
balancing delay fitted to the two calibration rows, or ``--balance-ms``). Run it on a
quiet machine; it takes about half a minute. (One shared queue is no reference here:
its identical simulated threads, started together, stay in phase and sleep together.)

    python bench/scheduler.py
    python bench/scheduler.py --balance-ms 8 --rows 3,8,4 3,40,20
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROWS = ("3,2,1", "3,8,4", "3,16,8", "3,8,1", "4,8,4", "5,2,1", "3,40,20", "3,100,50")


def main(argv: list[str] | None = None) -> int:
    from realrun.scheduler import CYCLES, SEEDS, fit_balance, measure, simulate_cycles

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", nargs="*", default=list(ROWS), metavar="N,C,S",
                    help="processes, compute ms, sleep ms per row")  # fmt: skip
    ap.add_argument("--balance-ms", type=float, default=None,
                    help="per-core queues' balancing delay (default: fitted here)")  # fmt: skip
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of each row")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    if args.balance_ms is None:
        balance, residual = fit_balance(measure(cores, CYCLES), cores)
        print(f"fitted balance delay {balance * 1e3:g} ms (residual {residual:.1%})")
    else:
        balance = args.balance_ms / 1e3

    def idle(row: dict, cycles: float) -> float:
        return 1.0 - cycles * row["compute_s"] / (cores * row["duration_s"])

    print(f"{cores} cores; idle share of the cores (run-queue wait per cycle)")
    print(f"{'N, C, S (ms)':14} {'measured':>18} {'per-core':>10}")
    for spec in args.rows:
        n, c_ms, s_ms = (float(x) for x in spec.split(","))
        (row,) = measure(cores, ((c_ms / 1e3, s_ms / 1e3, args.seconds),), processes=int(n))
        per_core = sum(simulate_cycles(row, cores, balance, s) for s in range(SEEDS)) / SEEDS
        print(
            f"{spec:14} {idle(row, row['cycles']):7.1%} ({row['run_wait_s'] * 1e3:5.2f} ms)"
            f" {idle(row, per_core):10.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
