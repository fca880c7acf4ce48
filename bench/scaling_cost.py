"""What a simulation costs as GPUs are added: wall time of ``simulate()`` per scheme.

ResNet-50 on the ``ib-cluster`` preset for 8, 64, 256 and 1024 GPUs (and the detailed
model up to 64), each configuration simulated ``--repeats`` times in this process; the
median wall time is reported with the events simulated, and the growth exponent ``k`` of
``wall ~ GPUs**k`` is fitted by least squares on the log-log points of each scheme.

Usage::

    python bench/scaling_cost.py [--schemes dp,p3,gossip] [--gpus 8,64,256,1024]
                                 [--detailed-gpus 8,64] [--iterations 1] [--repeats 3]

``--iterations`` counts measured iterations after one warm-up (default 1: two simulated
iterations per run keep p3 at 1024 GPUs, ~7 million messages, within minutes).
"""

from __future__ import annotations

import argparse
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
) -> tuple[float, int]:
    """Median wall seconds of ``simulate()`` and the events of one run."""
    config = build_config(
        RunSpec(
            scheme=scheme, gpus=gpus, topology=topology, fidelity=fidelity, iterations=iterations
        ),
        record_spans=False,
    )
    walls, events = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        events = simulate(config).events
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="dp,p3,gossip")
    ap.add_argument("--gpus", default="8,64,256,1024")
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
        f"median of {opts.repeats}"
    )
    print(f"{'scheme':>7} {'fidelity':>9} {'GPUs':>5} {'wall s':>8} {'events':>11} {'us/event':>8}")
    for scheme in opts.schemes.split(","):
        for fidelity, gpus in runs:
            points = []
            for p in gpus:
                repeats = opts.repeats if p <= 256 else 1
                wall, events = measure(scheme, p, fidelity, opts.iterations, repeats, opts.topology)
                points.append((p, wall))
                print(
                    f"{scheme:>7} {fidelity:>9} {p:5d} {wall:8.3f} {events:11,d} "
                    f"{1e6 * wall / events:8.2f}",
                    flush=True,
                )
            if len(points) > 1:
                print(
                    f"{scheme:>7} {fidelity:>9} exponent k = {exponent(points):.2f} "
                    f"(wall ~ GPUs^k over {points[0][0]}..{points[-1][0]})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
