"""Does compute slow down when more processes compute than there are cores?

Starts k = 1, 2, ... processes at once, each running a zoo model's forward and backward
on one thread in a loop for a few seconds (freed memory kept, as the machine-speed probe
runs: ``realrun.allocator``), and prints each one's steps per second and CPU seconds per
step. Where time-slicing costs nothing, the CPU per step stays what one process alone
takes and the steps per second fall as ``cores / k`` beyond ``k = cores``; a cost of
sharing (cache refills after each switch, memory bandwidth) shows as CPU per step growing
with k.

Usage::

    python bench/oversubscribed_compute.py [--model cnn_medium] [--max-procs 4] [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

WORKER = """
import sys, time, torch
from realrun import zoo
from realrun.allocator import keep_freed_memory
torch.set_num_threads(1)
keep_freed_memory()
name, seconds, start_at = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
model, inputs = zoo.build(name), zoo.example_inputs(name, int(sys.argv[4]))
for _ in range(3):
    model(*inputs).float().sum().backward()
while time.time() < start_at:
    time.sleep(0.001)
steps, t0, c0 = 0, time.perf_counter(), time.process_time()
while time.perf_counter() - t0 < seconds:
    model(*inputs).float().sum().backward()
    steps += 1
print(steps / (time.perf_counter() - t0), (time.process_time() - c0) / steps)
"""


def run(model: str, procs: int, seconds: float, batch: int) -> list[tuple[float, float]]:
    """``(steps per second, CPU seconds per step)`` of each of ``procs`` processes that
    compute at once."""
    start_at = time.time() + 5.0  # after every process has imported torch and warmed up
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, model, str(seconds), str(start_at), str(batch)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    out = []
    for child in children:
        stdout, _ = child.communicate()
        if child.returncode != 0:
            raise SystemExit(f"a worker failed (exit {child.returncode})")
        rate, cpu = stdout.split()
        out.append((float(rate), float(cpu)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn_medium", help="zoo model [cnn_medium]")
    parser.add_argument("--max-procs", type=int, default=4, help="largest k [4]")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds [6]")
    parser.add_argument("--batch-size", type=int, default=24, help="samples per step [24]")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{args.model}, batch {args.batch_size}, {cores} cores")
    alone = None
    for k in range(1, args.max_procs + 1):
        rows = run(args.model, k, args.seconds, args.batch_size)
        rate = statistics.median(r for r, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        alone = alone or (rate, cpu)
        ideal = alone[0] * min(1.0, cores / k)
        print(
            f"k={k}: {rate:7.2f} steps/s each ({rate / ideal:.2f} of cores/k sharing), "
            f"{cpu * 1e3:6.1f} ms CPU a step ({cpu / alone[1]:.2f}x alone)"
        )


if __name__ == "__main__":
    main()
