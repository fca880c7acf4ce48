"""How close the work guard's estimate (``simcore.guard.estimate``) comes to real runs.

Each configuration is simulated in a fresh process (``resource`` reports its peak memory);
printed per row: estimated and measured model events, wall seconds of ``simulate()`` and
peak memory, and their ratios (estimate / measured).

Usage::

    python bench/guard_estimate.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate
from simcore.guard import estimate
kw = json.loads(sys.argv[1])
config = build_config(RunSpec(**kw), record_spans=False)
est = estimate(config)
t = time.perf_counter()
r = simulate(config)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"est_events": est.events, "est_s": est.seconds, "est_mem": est.memory_bytes,
                  "events": r.model_events, "wall": wall, "mem": rss}))
"""


def grid(quick: bool) -> list[dict]:
    rows = [
        dict(scheme="dp", gpus=8),
        dict(scheme="p3", gpus=8),
        dict(scheme="ps", gpus=8),
        dict(scheme="gossip", gpus=8),
        dict(scheme="gpipe", gpus=4),
        dict(scheme="dp", gpus=1024, topology="ib-cluster", fidelity="analytic"),
        dict(scheme="ps", gpus=1024, topology="ib-cluster", fidelity="analytic"),
    ]
    if not quick:
        rows += [
            dict(scheme="dp", gpus=64, topology="ib-cluster"),
            dict(
                scheme="ps",
                gpus=64,
                topology="ib-cluster",
                fidelity="analytic",
                scheme_options={"mean_field": "off"},
            ),
            dict(scheme="p3", gpus=64, topology="ib-cluster"),
            dict(scheme="gossip", gpus=1024, topology="ib-cluster", fidelity="analytic"),
            dict(scheme="p3", gpus=1024, topology="ib-cluster", fidelity="analytic"),
            dict(scheme="pipedream", gpus=8, iterations=20),
            dict(scheme="dp", gpus=8, iterations=200),
        ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    opts = ap.parse_args()
    print(
        f"{'configuration':<58} {'events est/real':>22} {'wall s est/real':>17} "
        f"{'memory MB est/real':>19}"
    )
    for kw in grid(opts.quick):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(kw)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        m = json.loads(out.strip().splitlines()[-1])
        name = " ".join(f"{k}={v}" for k, v in kw.items())
        print(
            f"{name:<58} {m['est_events']:>10,d}/{m['events']:<10,d} "
            f"{m['est_s']:7.2f}/{m['wall']:<7.2f} {m['est_mem'] / 1e6:8.0f}/"
            f"{m['mem'] / 1e6:<8.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
