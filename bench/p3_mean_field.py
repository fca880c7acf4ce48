"""How close P3's mean-field model (analytic fidelity) comes to the full model.

For each configuration, ``p3`` in the analytic fidelity is simulated twice: with the
mean-field model (``mean_field=on``, two machines simulated and mirrored; ``auto`` uses
it from five machines on) and with every worker and server (``mean_field=off``).
Printed per row: both iteration times, the mean field's error against the full model's
mean and against its fastest measured iteration, the spread of the full model's measured
iterations (slowest / fastest; well above 1 when it swings between slow and fast
iterations), and the wall time of each. The configurations are the P3 paper's (one GPU
per host on Ethernet, 1-30 Gbps) at 4 and 16 hosts, and ResNet-50 and VGG-16 on the
``ib-cluster`` preset (4 GPUs per machine) up to 64 GPUs, where the full model is still
cheap enough to compare against.

Usage::

    python bench/p3_mean_field.py [--iterations 4] [--quick]
"""

from __future__ import annotations

import argparse
import time

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate


def grid(quick: bool) -> list[tuple[str, str, str | None, int]]:
    """``(topology, model, bandwidth, gpus)`` rows."""
    if quick:
        return [("ethernet", "resnet50", "10Gbps", 4), ("ib-cluster", "resnet50", None, 16)]
    rows = [
        ("ethernet", model, bw, gpus)
        for model in ("resnet50", "vgg16", "gnmt")
        for bw in ("1Gbps", "10Gbps", "30Gbps")
        for gpus in (4, 16)
    ]
    rows += [("ib-cluster", "resnet50", None, gpus) for gpus in (16, 64)]
    rows += [("ib-cluster", "vgg16", "10Gbps", gpus) for gpus in (16, 64)]
    return rows


def run(
    topology: str, model: str, bandwidth: str | None, gpus: int, mean_field: str, iterations: int
) -> tuple[float, tuple[float, ...], float, bool]:
    """Iteration time, measured iteration times, wall seconds, whether the mean field ran."""
    spec = RunSpec(
        scheme="p3",
        gpus=gpus,
        topology=topology,
        model=model,
        fidelity="analytic",
        iterations=iterations,
        scheme_options={"mean_field": mean_field},
        **({"bandwidth": bandwidth} if bandwidth else {}),
    )
    config = build_config(spec, record_spans=False)
    t = time.perf_counter()
    r = simulate(config)
    wall = time.perf_counter() - t
    measured = r.iteration_times_s[r.warmup_iterations :]
    return r.iteration_time_s, measured, wall, bool(r.extra["mean_field"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--iterations",
        type=int,
        default=4,
        help="measured iterations after one warm-up (default 4)",
    )
    ap.add_argument("--quick", action="store_true", help="two rows only")
    opts = ap.parse_args()
    print(f"p3, analytic fidelity, {opts.iterations} measured iterations after 1 warm-up")
    print(
        f"{'topology':>10} {'model':>8} {'link':>6} {'GPUs':>4} {'mean field':>11} "
        f"{'full':>10} {'error':>7} {'vs fastest':>10} {'spread':>6} {'wall mf':>8} "
        f"{'wall full':>9}"
    )
    errors = []
    for topology, model, bw, gpus in grid(opts.quick):
        mf, _, wall_mf, used = run(topology, model, bw, gpus, "on", opts.iterations)
        full, its, wall_full, _ = run(topology, model, bw, gpus, "off", opts.iterations)
        if not used:
            raise SystemExit(f"the mean field did not apply to {topology} with {gpus} GPUs")
        err = mf / full - 1
        errors.append(err)
        print(
            f"{topology:>10} {model:>8} {bw or 'preset':>6} {gpus:4d} {1e3 * mf:8.1f} ms "
            f"{1e3 * full:7.1f} ms {100 * err:+6.1f}% {100 * (mf / min(its) - 1):+9.1f}% "
            f"{max(its) / min(its):6.2f} {wall_mf:7.2f}s {wall_full:8.2f}s",
            flush=True,
        )
    close = sum(abs(e) <= 0.01 for e in errors)
    print(
        f"within 1% of the full model: {close} of {len(errors)} rows; "
        f"largest error {100 * max(errors, key=abs):+.1f}%"
    )


if __name__ == "__main__":
    main()
