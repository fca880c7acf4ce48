"""P3's throughput gain over the ps baseline across link rates (the P3 paper's sweep).

Four one-GPU hosts on one Ethernet switch (the ``ethernet`` preset, a co-located server on
every host), links from 1 to 30 Gbps; for each model and rate, ``ps`` and ``p3`` are
simulated in-process and P3's gain is ``throughput(p3) / throughput(ps) - 1``. The paper's
headline gains are printed next to the peak the model finds.

Usage::

    python bench/p3_bandwidth.py [--models resnet50,vgg16,gnmt] [--gbps 1,2,4,...]
                                 [--fidelity detailed] [--iterations 3]
"""

from __future__ import annotations

import argparse
import time

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate

PAPER = {"resnet50": ("ResNet-50", 25), "gnmt": ("Sockeye", 38), "vgg16": ("VGG-19", 66)}
"""Model -> (the paper's model, its headline gain in percent)."""

GBPS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30)


def gain_row(model: str, gbps: float, fidelity: str, iterations: int) -> dict[str, float]:
    """Iteration times of ps and p3 and P3's gain (percent) at ``gbps``."""
    out: dict[str, float] = {}
    for scheme in ("ps", "p3"):
        spec = RunSpec(
            scheme=scheme,
            gpus=4,
            topology="ethernet",
            model=model,
            bandwidth=f"{gbps:g}Gbps",
            fidelity=fidelity,
            iterations=iterations,
        )
        r = simulate(build_config(spec, record_spans=False))
        out[scheme] = r.iteration_time_s
        out[f"{scheme}_thr"] = r.throughput_samples_s
        out[f"{scheme}_wall"] = r.wall_s
    out["gain"] = 100 * (out["p3_thr"] / out["ps_thr"] - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,vgg16,gnmt")
    ap.add_argument("--gbps", default=",".join(map(str, GBPS)))
    ap.add_argument("--fidelity", default="detailed", choices=("detailed", "analytic"))
    ap.add_argument(
        "--iterations", type=int, default=3, help="measured iterations per run (after one warm-up)"
    )
    opts = ap.parse_args()
    rates = [float(x) for x in opts.gbps.split(",")]
    t0 = time.perf_counter()
    print(
        "4 one-GPU hosts (ethernet preset, co-located servers); P3 gain = "
        "throughput(p3) / throughput(ps) - 1"
    )
    for model in opts.models.split(","):
        print(f"\n{model}")
        print(f"  {'Gbps':>5}  {'ps ms':>8}  {'p3 ms':>8}  {'gain':>7}  {'wall s':>6}")
        best = (-1e9, 0.0)
        for gbps in rates:
            row = gain_row(model, gbps, opts.fidelity, opts.iterations)
            best = max(best, (row["gain"], gbps))
            print(
                f"  {gbps:5g}  {1e3 * row['ps']:8.1f}  {1e3 * row['p3']:8.1f}  "
                f"{row['gain']:6.1f}%  {row['ps_wall'] + row['p3_wall']:6.1f}",
                flush=True,
            )
        name, paper = PAPER.get(model, (model, float("nan")))
        print(f"  peak gain {best[0]:.1f}% at {best[1]:g} Gbps; the paper: +{paper}% for {name}")
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
