"""How close the mean-field models of ``ps`` and ``gossip`` (analytic fidelity) come to
their full models.

For each configuration the scheme is simulated twice in the analytic fidelity: with its
mean-field model (``mean_field=on``: two machines simulated and mirrored onto the rest;
``auto`` uses it from five machines on for ``ps``, from four for ``gossip``) and with
every worker and server (``mean_field=off``). Printed per row: both iteration times, the
mean field's error against the full model's mean, the spread of the full model's measured
iterations (slowest / fastest; well above 1 when it swings between slow and fast
iterations), whether the payload totals agree, and the wall time of each.

``ps`` keeps its uneven hash placement in the mean field (every server its real shards,
see ``simcore/schemes/_psbase.py``); ``gossip``'s mean field is exact up to the order of
simultaneous sends (see ``simcore/schemes/gossip.py``). The configurations: one GPU per
host on Ethernet (the P3 paper's setting) at 8 and 16 hosts and 1-30 Gbps, and the
``ib-cluster`` preset (4 GPUs per machine) up to 128 GPUs, where the full models are
still cheap enough to compare against.

Usage::

    python bench/mean_field_accuracy.py [--schemes ps,gossip] [--iterations 4] [--quick]
"""

from __future__ import annotations

import argparse
import time

from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate


def grid(scheme: str, quick: bool) -> list[tuple[str, str, str | None, int]]:
    """``(topology, model, bandwidth, gpus)`` rows."""
    if quick:
        return [("ib-cluster", "resnet50", None, 32), ("ib-cluster", "vgg16", "10Gbps", 32)]
    if scheme == "gossip":
        rows = [("ib-cluster", "resnet50", None, g) for g in (16, 64, 256)]
        rows += [
            ("ib-cluster", "resnet50", "10Gbps", 64),
            ("ib-cluster", "vgg16", "5Gbps", 32),
            ("dgx1", "resnet50", None, 64),
            ("ethernet", "vgg16", "10Gbps", 16),
        ]
        return rows
    rows = [
        ("ethernet", model, bw, gpus)
        for model in ("resnet50", "vgg16")
        for bw in ("1Gbps", "10Gbps", "30Gbps")
        for gpus in (8, 16)
    ]
    rows += [("ib-cluster", "resnet50", None, gpus) for gpus in (32, 64, 128)]
    rows += [("ib-cluster", "vgg16", "10Gbps", gpus) for gpus in (32, 64)]
    return rows


def run(
    scheme: str,
    topology: str,
    model: str,
    bandwidth: str | None,
    gpus: int,
    mean_field: str,
    iterations: int,
) -> tuple[object, float]:
    """The result and the wall seconds of ``simulate()``."""
    spec = RunSpec(
        scheme=scheme,
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
    return r, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="ps,gossip")
    ap.add_argument(
        "--iterations",
        type=int,
        default=4,
        help="measured iterations after one warm-up (default 4)",
    )
    ap.add_argument("--quick", action="store_true", help="two rows per scheme")
    opts = ap.parse_args()
    print(f"analytic fidelity, {opts.iterations} measured iterations after 1 warm-up")
    print(
        f"{'scheme':>6} {'topology':>10} {'model':>8} {'link':>6} {'GPUs':>4} "
        f"{'mean field':>11} {'full':>10} {'error':>7} {'spread':>6} {'bytes':>5} "
        f"{'wall mf':>8} {'wall full':>9}"
    )
    for scheme in opts.schemes.split(","):
        errors = []
        for topology, model, bw, gpus in grid(scheme, opts.quick):
            mf, wall_mf = run(scheme, topology, model, bw, gpus, "on", opts.iterations)
            full, wall_full = run(scheme, topology, model, bw, gpus, "off", opts.iterations)
            if not mf.extra["mean_field"]:
                raise SystemExit(f"the mean field did not apply to {topology} with {gpus} GPUs")
            its = full.iteration_times_s[full.warmup_iterations :]
            err = mf.iteration_time_s / full.iteration_time_s - 1
            errors.append(err)
            same = (
                "same"
                if abs(mf.comm_bytes_total / full.comm_bytes_total - 1) < 1e-6
                else f"{mf.comm_bytes_total / full.comm_bytes_total:.3f}"
            )
            print(
                f"{scheme:>6} {topology:>10} {model:>8} {bw or 'preset':>6} {gpus:4d} "
                f"{1e3 * mf.iteration_time_s:8.1f} ms {1e3 * full.iteration_time_s:7.1f} ms "
                f"{100 * err:+6.1f}% {max(its) / min(its):6.2f} {same:>5} {wall_mf:7.2f}s "
                f"{wall_full:8.2f}s",
                flush=True,
            )
        close = sum(abs(e) <= 0.01 for e in errors)
        within5 = sum(abs(e) <= 0.05 for e in errors)
        print(
            f"{scheme}: within 1% of the full model in {close} of {len(errors)} rows, "
            f"within 5% in {within5}; largest error {100 * max(errors, key=abs):+.1f}%",
            flush=True,
        )


if __name__ == "__main__":
    main()
