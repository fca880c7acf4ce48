"""What a simulation costs as GPUs are added: wall time of ``simulate()`` per scheme.

ResNet-50 on the ``ib-cluster`` preset for 8, 64, 256, 1024 and 4096 GPUs (and the
detailed model up to 64), each configuration simulated ``--repeats`` times in this process
(once from 1024 GPUs on); the median wall time and the CPU time of that run are reported
with the events simulated and whether a mean-field model ran, and the growth exponent
``k`` of ``wall ~ GPUs**k`` (and of the CPU time, which other jobs on the machine disturb
less) is fitted by least squares on the log-log points of each scheme.

Usage::

    python bench/scaling_cost.py [--schemes dp,ps,p3,gossip] [--gpus 8,64,256,1024,4096]
                                 [--detailed-gpus 8,64] [--iterations 1] [--repeats 3]

``--iterations`` counts measured iterations after one warm-up (default 1).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate


def exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(wall) against log(GPUs)."""
    xs = [math.log(p) for p, _ in points]
    ys = [math.log(w) for _, w in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def measure(
    scheme: str, gpus: int, fidelity: str, iterations: int, repeats: int, topology: str
) -> tuple[float, float, int, bool]:
    """Median wall seconds of ``simulate()``, CPU seconds of that run, the events of one
    run and whether it ran a mean-field model."""
    config = build_config(
        RunSpec(
            scheme=scheme, gpus=gpus, topology=topology, fidelity=fidelity, iterations=iterations
        ),
        record_spans=False,
    )
    runs, events, mf = [], 0, False
    gc.collect()  # the previous point's garbage is not this point's cost
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        r = simulate(config)
        runs.append((time.perf_counter() - t, time.process_time() - c))
        events, mf = r.events, bool(r.extra.get("mean_field", False))
    runs.sort()
    return runs[len(runs) // 2] + (events, mf)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="dp,ps,p3,gossip")
    ap.add_argument("--gpus", default="8,64,256,1024,4096")
    ap.add_argument("--detailed-gpus", default="8,64")
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--topology", default="ib-cluster")
    opts = ap.parse_args()
    runs = [
        ("analytic", [int(x) for x in opts.gpus.split(",")]),
        ("detailed", [int(x) for x in opts.detailed_gpus.split(",") if x]),
    ]
    print(
        f"resnet50 on {opts.topology}, {opts.iterations + 1} simulated iterations per run, "
        f"median of {opts.repeats} below 1024 GPUs"
    )
    print(
        f"{'scheme':>7} {'fidelity':>9} {'GPUs':>5} {'wall s':>8} {'cpu s':>8} "
        f"{'events':>11} {'mean field':>10}"
    )
    for scheme in opts.schemes.split(","):
        for fidelity, gpus in runs:
            points, cpu_points = [], []
            for p in gpus:
                repeats = opts.repeats if p < 1024 else 1
                wall, cpu, events, mf = measure(
                    scheme, p, fidelity, opts.iterations, repeats, opts.topology
                )
                points.append((p, wall))
                cpu_points.append((p, cpu))
                print(
                    f"{scheme:>7} {fidelity:>9} {p:5d} {wall:8.3f} {cpu:8.3f} {events:11,d} "
                    f"{'yes' if mf else 'no':>10}",
                    flush=True,
                )
            if len(points) > 1:
                print(
                    f"{scheme:>7} {fidelity:>9} exponent k = {exponent(points):.2f} wall, "
                    f"{exponent(cpu_points):.2f} cpu (over {points[0][0]}..{points[-1][0]} "
                    f"GPUs)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
