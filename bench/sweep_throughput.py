"""Benchmark ``sim sweep``: points per second with 1 and 2 local workers, and the overhead
per point against calling ``simulate()`` in a loop.

The sweep: 1,000 small points, ``dp`` and ``ps`` x 2 and 4 GPUs x 50 bandwidths (1-50
Gbps) x 5 seeds, AlexNet on one-GPU Ethernet hosts, analytic network model, one measured
iteration (a few milliseconds of simulation each, so that overhead shows).

Measured, ``--repeats`` times each, medians reported:

1. ``simulate()`` loop: the 1,000 configs built beforehand, simulated one after the other
   in this process: the floor.
2. ``run_sweep(jobs=1)``: the same points in this process, through the whole sweep path
   (spec to config, row flattening, journal append and flush, fsync once a second, the
   Parquet file written at the end). Overhead per point = (sweep wall time - the time
   its points spent inside ``simulate()``, from their ``wall_s``) / 1,000: measured
   within one run, so a machine shared with others disturbs it less than comparing
   two runs would.
3. ``run_sweep(jobs=2)``: two joblib (loky) worker processes (started once before, as a
   long sweep would amortise them), right after (2). Parallel efficiency =
   wall(1 worker) / (2 x wall(2 workers)), the median over these back-to-back pairs.
4. With ``--dask``: a ``LocalCluster`` of two single-threaded worker processes.
5. The pieces of the overhead timed one at a time: spec to config, result to row,
   journal append, the table written at the end.

Usage::

    python bench/sweep_throughput.py [--repeats 3] [--dask]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from analysis.sweep import plan_sweep, run_sweep
from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore.engine import simulate

AXES = {
    "scheme": ("dp", "ps"),
    "gpus": (2, 4),
    "bandwidth": tuple(f"{g}Gbps" for g in range(1, 51)),
    "seed": (0, 1, 2, 3, 4),
}
BASE = RunSpec().replace(model="alexnet", topology="ethernet", fidelity="analytic", iterations=1)


def time_simulate_loop(plan) -> float:
    """Seconds to simulate every point's prebuilt config in a loop."""
    configs = [build_config(p.spec, record_spans=False) for p in plan.points]
    t = time.perf_counter()
    for c in configs:
        simulate(c)
    return time.perf_counter() - t


def time_sweep(plan, folder: str, tag: str, **kw) -> tuple[float, float]:
    """``(seconds for run_sweep into a fresh Parquet file, seconds spent inside
    simulate() by its points)``."""
    import pandas as pd

    out = os.path.join(folder, f"{tag}-{time.monotonic_ns()}.parquet")
    t = time.perf_counter()
    s = run_sweep(plan, out, **kw)
    wall = time.perf_counter() - t
    assert s.computed == len(plan.points) and s.failed == 0, s
    return wall, float(pd.read_parquet(out, columns=["wall_s"])["wall_s"].sum())


def component_costs(plan, folder: str) -> dict[str, float]:
    """Seconds per point of each piece of the sweep path outside ``simulate()``, timed
    one piece at a time over the plan's points (results simulated beforehand)."""
    from analysis.store import SweepStore
    from analysis.sweep import flatten_result
    from dtsim.spec import apply_settings

    n = len(plan.points)
    specs = [p.spec.to_dict() for p in plan.points]
    results = [simulate(build_config(p.spec, record_spans=False)) for p in plan.points]
    t0 = time.perf_counter()
    for d in specs:
        build_config(apply_settings(RunSpec(), d), record_spans=False)
    t1 = time.perf_counter()
    rows = []
    for p, r in zip(plan.points, results, strict=True):
        rows.append(
            {
                "point_id": p.point_id,
                "status": "ok",
                **flatten_result(r.to_dict()),
                **p.values,
                "error": "",
                "spec": "{}",
            }
        )
    t2 = time.perf_counter()
    with SweepStore(os.path.join(folder, f"parts-{time.monotonic_ns()}.parquet")) as store:
        t3 = time.perf_counter()
        for row in rows:
            store.append(row)
        t4 = time.perf_counter()
        store.save()
        t5 = time.perf_counter()
    return {
        "spec -> config": (t1 - t0) / n,
        "result -> row": (t2 - t1) / n,
        "journal append": (t4 - t3) / n,
        "table at the end": (t5 - t4) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dask", action="store_true", help="also measure a Dask LocalCluster")
    opts = ap.parse_args()

    plan = plan_sweep(BASE, AXES)
    n = len(plan.points)
    small = plan_sweep(BASE, {**AXES, "bandwidth": ("1Gbps",), "seed": (9,)})
    walls: dict[str, list[float]] = {"loop": [], "jobs1": [], "jobs2": [], "dask2": []}
    overheads, efficiencies = [], []
    cluster = client_addr = None
    if opts.dask:
        from dask.distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client_addr = cluster.scheduler_address
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        simulate(build_config(plan.points[0].spec, record_spans=False))  # warm caches
        time_sweep(small, folder, "warm", jobs=2)  # start the loky workers once
        for _ in range(opts.repeats):
            walls["loop"].append(time_simulate_loop(plan))
            w1, inside = time_sweep(plan, folder, "j1", jobs=1)
            walls["jobs1"].append(w1)
            overheads.append((w1 - inside) / n)
            w2, _ = time_sweep(plan, folder, "j2", jobs=2)
            walls["jobs2"].append(w2)
            efficiencies.append(w1 / (2 * w2))
            if client_addr:
                walls["dask2"].append(time_sweep(plan, folder, "dask", scheduler=client_addr)[0])
        parts = [component_costs(plan, folder) for _ in range(opts.repeats)]
    if cluster is not None:
        cluster.close()
    load = max(load, os.getloadavg()[0])

    med = {k: statistics.median(v) for k, v in walls.items() if v}
    rate = {k: n / v for k, v in med.items()}
    overhead = statistics.median(overheads)
    print(
        f"sweep              {n} points: dp,ps x 2,4 GPUs x 50 bandwidths x 5 seeds "
        f"(alexnet, ethernet, analytic, 1 iteration)"
    )
    print(
        f"repeats            {opts.repeats}, medians (cpu count {os.cpu_count()}, "
        f"1-min load average up to {load:.1f})"
    )
    print(
        f"simulate() loop    {rate['loop']:7.1f} points/s  "
        f"({1e3 * med['loop'] / n:.2f} ms per point)"
    )
    print(
        f"sweep, 1 worker    {rate['jobs1']:7.1f} points/s  "
        f"({1e3 * med['jobs1'] / n:.2f} ms per point)"
    )
    print(f"sweep, 2 workers   {rate['jobs2']:7.1f} points/s  (joblib, loky processes)")
    if "dask2" in rate:
        print(f"dask, 2 workers    {rate['dask2']:7.1f} points/s  (LocalCluster, 2 processes)")
    print(
        f"overhead           {1e3 * overhead:.3f} ms per point outside simulate() in the "
        f"1-worker sweep ({100 * overhead / (med['loop'] / n):.1f}% of a point's "
        f"simulate() time in the loop)"
    )
    print(
        "  of which         "
        + ", ".join(f"{k} {1e3 * statistics.median(p[k] for p in parts):.3f} ms" for k in parts[0])
    )
    print(
        f"parallel eff.      {100 * statistics.median(efficiencies):.0f}% "
        f"(2 workers vs 1, median of back-to-back pairs)"
    )
    for k, v in walls.items():
        if v:
            print(f"  raw {k:6s} " + " ".join(f"{x:.2f}s" for x in v))
    print("  raw overhead " + " ".join(f"{1e3 * x:.3f}ms" for x in overheads))


if __name__ == "__main__":
    main()
