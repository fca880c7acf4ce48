"""When gossip posts its receives, and what that does to the iteration.

Four ranks on an emulated cluster (``realrun.netns``, links shaped to ``--rate``) run
GossipGraD's weight exchange with gloo: each iteration a rank waits for its partner's
model of the last iteration, message by message, then sends its own model of this
iteration to this iteration's partner (the hypercube with the rank XOR 1, 2, 3 in turn,
as ``simcore.schemes.gossip.partners`` pairs four ranks) and computes, here a sleep of
``--compute-ms`` (no CPU, so only the exchange's timing is measured). The messages are
``mlp_medium``'s with SGD momentum by default (weights and momentum of each layer).

The ranks differ only in when they post the receives of the next iteration:

* ``grouped``: all of iteration ``t``'s once every message of ``t - 1`` is in (what
  ``realrun.schemes.gossip`` does when exchanging weights);
* ``window+K``: ``layers + K`` receives kept posted in the order they are used, so each
  of ``t``'s is posted as the message of its slot in ``t - 1`` arrives, and the first
  ``K`` of ``t`` while ``t - 1``'s are still coming (``window+2``: the runtime before
  grouped posting, whose window also held two batch messages).

Prints each policy's mean iteration (over the ranks and the measured iterations), its
spread over the ranks, and the wire time of one model at the rate.

    python bench/gossip_posting.py                       # 1 Gbit/s, four policies
    python bench/gossip_posting.py --rate 200Mbps --iterations 12

Needs root (network namespaces); nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from realrun.netns import EmulatedCluster, terminate_as_interrupt
from simcore.units import UnitError, parse_rate

MLP_MEDIUM_MESSAGES = (2105344, 8396800, 8396800, 82000)
"""Bytes of ``mlp_medium``'s gossip messages with SGD momentum (weights and momentum
buffer of each layer), in the order they are sent and used."""

PORT = 29541

_RANK = r"""
import json, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, addr, port, policy, iterations, compute_s = (
    int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
    float(sys.argv[6]))
sizes = json.loads(sys.argv[7])
dist.init_process_group("gloo", rank=rank, world_size=4, init_method=f"tcp://{addr}:{port}")
partner = lambda it: rank ^ (1, 2, 3)[it % 3]
outs = [torch.zeros(n // 4) for n in sizes]
order = [(it, slot) for it in range(iterations) for slot in range(len(sizes))]
posted, nxt = {}, 0
def post(upto):
    global nxt
    while nxt < len(order) and order[nxt] <= upto:
        it, slot = order[nxt]
        buf = torch.zeros(sizes[slot] // 4)
        posted[(it, slot)] = dist.irecv(buf, partner(it))
        nxt += 1
extra = None if policy == "grouped" else int(policy.split("+")[1])
def refill():
    if extra is not None:
        k = min(len(order), nxt + len(sizes) + extra - len(posted))
        if k > nxt:
            post(order[k - 1])
post((0, len(sizes) - 1))
refill()
dist.barrier()
starts, sends = [], []
for it in range(iterations):
    if it > 0:
        for slot in range(len(sizes)):
            posted.pop((it - 1, slot)).wait()
            refill()
        if extra is None:
            post((it, len(sizes) - 1))
    starts.append(time.monotonic())
    sends += [dist.isend(b, partner(it)) for b in outs]
    time.sleep(compute_s)
for slot in range(len(sizes)):
    posted.pop((iterations - 1, slot)).wait()
for s in sends:
    s.wait()
print(json.dumps([b - a for a, b in zip(starts, starts[1:])]), flush=True)
dist.destroy_process_group()
"""


def run_policy(
    emu: EmulatedCluster, policy: str, iterations: int, compute_s: float, sizes: list[int]
) -> list[list[float]]:
    """Each rank's iteration times (start to start) under ``policy``."""
    procs = []
    try:
        for h in emu.hosts:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": h.ifname}
            argv = [sys.executable, "-c", _RANK, h.index, emu.hosts[0].address, PORT, policy,
                    iterations, compute_s, json.dumps(sizes)]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    emu.command(h.index, argv),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        return [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="1Gbps", help="link rate (default 1Gbps)")
    ap.add_argument("--iterations", type=int, default=14, help="iterations per policy")
    ap.add_argument("--warmup", type=int, default=3, help="iterations left out at the start")
    ap.add_argument("--compute-ms", type=float, default=25.0, help="sleep per iteration")
    ap.add_argument(
        "--policies", default="grouped,window+0,window+2,grouped",
        help="comma-separated: grouped, window+K (default: grouped,window+0,window+2,grouped)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    try:
        rate = parse_rate(args.rate)
    except UnitError as err:
        ap.error(f"--rate: {err}")
    policies = args.policies.split(",")
    for p in policies:
        if p != "grouped" and not (p.startswith("window+") and p[7:].isdigit()):
            ap.error(f"--policies: {p!r} is not grouped or window+K")
    if args.iterations <= args.warmup + 1:
        ap.error(f"--iterations must exceed --warmup + 1, got {args.iterations}")
    sizes = list(MLP_MEDIUM_MESSAGES)
    wire_ms = sum(sizes) / rate * 1e3
    print(f"{args.rate}: one model {sum(sizes) / 1e6:.1f} MB, {wire_ms:.0f} ms on the wire; "
          f"compute {args.compute_ms:.0f} ms (a sleep)")  # fmt: skip
    with terminate_as_interrupt(), EmulatedCluster(4, rate, prefix="dtgpost") as emu:
        for policy in policies:
            ranks = run_policy(emu, policy, args.iterations, args.compute_ms / 1e3, sizes)
            means = [statistics.mean(r[args.warmup :]) * 1e3 for r in ranks]
            print(f"{policy:10s} mean iteration {statistics.mean(means):6.1f} ms "
                  f"(ranks {min(means):.1f}-{max(means):.1f}), "
                  f"{statistics.mean(means) / wire_ms:.2f}x the wire time")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
