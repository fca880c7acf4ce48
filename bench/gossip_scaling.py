"""Compute efficiency of gossip (GossipGraD) and dp (ring all-reduce) from 8 to 1024 GPUs.

ResNet-50 at a fixed per-GPU batch on the ``ib-cluster`` preset (4 P100 per node, nodes on
InfiniBand EDR). Compute efficiency is the 1-GPU iteration time over the p-GPU iteration
time. For dp the table also shows the latency part of its ring all-reduces per iteration,
``buckets x 2(p-1) x alpha`` (``alpha`` the slowest route between ring neighbours), the
term that grows with p while gossip's per-GPU work stays constant.

Usage::

    python bench/gossip_scaling.py [--gpus 8,16,...,1024] [--fidelity analytic]
                                   [--iterations 3] [--topology ib-cluster]
                                   [--exchange weights|gradients|gradients+weights]
"""

from __future__ import annotations

import argparse
import time

from simpy import Environment

from dtsim.resolve import build_config, load_preset
from dtsim.spec import RunSpec
from simcore import TopologySpec, build_topology, simulate
from simcore.collectives import Collectives
from simcore.network import AnalyticNetwork
from simcore.schemes.dp import DPOptions, ddp_buckets

GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)


def ring_latency_s(topology: str, gpus: int, buckets: int) -> float:
    """``buckets x 2(p-1) x alpha`` of dp's ring all-reduces on ``gpus`` GPUs (seconds)."""
    topo = build_topology(TopologySpec(load_preset(topology), gpus))
    coll = Collectives(AnalyticNetwork(Environment(), topo))
    fixed_s = coll.cost_model("allreduce-ring", tuple(topo.ring_order))[0]
    return buckets * fixed_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default=",".join(map(str, GPUS)))
    ap.add_argument("--fidelity", default="analytic", choices=("detailed", "analytic"))
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--topology", default="ib-cluster")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--exchange", default="weights", help="gossip's scheme.exchange")
    opts = ap.parse_args()
    base = RunSpec(
        topology=opts.topology, model=opts.model, fidelity=opts.fidelity, iterations=opts.iterations
    )
    one = simulate(build_config(base.replace(scheme="dp", gpus=1), record_spans=False))
    config = build_config(base, record_spans=False)
    dp_opts = DPOptions()
    buckets = len(ddp_buckets(config.trace, dp_opts.bucket_bytes, dp_opts.first_bucket_bytes))
    t1 = one.iteration_time_s
    print(
        f"{opts.model} on {opts.topology}, {opts.fidelity} fidelity; 1 GPU: "
        f"{1e3 * t1:.1f} ms per iteration; dp ring over {buckets} buckets; gossip "
        f"exchanges {opts.exchange}"
    )
    print(
        f"{'GPUs':>5}  {'gossip ms':>9}  {'eff':>6}  {'dp ms':>8}  {'eff':>6}  "
        f"{'ring latency ms':>15}  {'wall s':>7}"
    )
    for p in (int(x) for x in opts.gpus.split(",")):
        t = time.perf_counter()
        spec = base.replace(scheme="gossip", gpus=p, **{"scheme.exchange": opts.exchange})
        gossip = simulate(build_config(spec, record_spans=False))
        dp = simulate(build_config(base.replace(scheme="dp", gpus=p), record_spans=False))
        lat = ring_latency_s(opts.topology, p, buckets)
        print(
            f"{p:5d}  {1e3 * gossip.iteration_time_s:9.1f}  "
            f"{t1 / gossip.iteration_time_s:6.3f}  {1e3 * dp.iteration_time_s:8.1f}  "
            f"{t1 / dp.iteration_time_s:6.3f}  {1e3 * lat:15.2f}  "
            f"{time.perf_counter() - t:7.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
