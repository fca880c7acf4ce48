"""Does a shaped link carry a flow as fast when traffic goes the other way too?

Builds three emulated hosts (:class:`realrun.netns.EmulatedCluster`; root and network
namespaces needed) with every link shaped to ``--rate``, and times TCP transfers of
``--bytes`` (plain sockets, as :func:`realrun.netns.measure_goodput` does) in three
patterns: one flow alone (0->1), two flows in opposite directions between the same hosts
(0->1 with 1->0), and a chain (0->1 with 1->2: host 1's egress carries its own data and
the ACKs of what it receives, as a pipeline's middle rank's does). Prints each flow's
goodput and its share of the rate, per round. The calibration measures one direction at
a time; docs/validation.md (the schedules matrix) has what this showed and why it
matters. About 10 s a round at the default rate.

    python bench/two_way_goodput.py                      # 50 Mbit/s, 2 rounds
    python bench/two_way_goodput.py --rate 200Mbps --bytes 24000000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from realrun.netns import _RECEIVER, _SENDER, EmulatedCluster
from simcore.units import parse_rate

PATTERNS = (
    ("alone 0->1", ((0, 1),)),
    ("both ways 0<->1", ((0, 1), (1, 0))),
    ("chain 0->1, 1->2", ((0, 1), (1, 2))),
)


def goodputs(cluster: EmulatedCluster, pairs: tuple[tuple[int, int], ...], nbytes: int) -> list:
    """Each flow's goodput (bytes/s) when all of ``pairs`` (src, dst) send ``nbytes`` at
    once: from the sender's first byte to the receiver's last."""
    receivers = []
    for _src, dst in pairs:
        host = cluster.hosts[dst]
        argv = [sys.executable, "-c", _RECEIVER, host.address, str(nbytes)]
        proc = subprocess.Popen(cluster.command(dst, argv), stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        receivers.append((proc, proc.stdout.readline().strip()))
    senders = []
    for (src, dst), (_proc, port) in zip(pairs, receivers, strict=True):
        argv = [sys.executable, "-c", _SENDER, cluster.hosts[dst].address, port, str(nbytes)]
        senders.append(
            subprocess.Popen(cluster.command(src, argv), stdout=subprocess.PIPE, text=True)
        )
    out = []
    for send, (recv, _port) in zip(senders, receivers, strict=True):
        start = float(send.communicate(timeout=120)[0].strip())
        got, end = recv.communicate(timeout=120)[0].split()
        if int(got) != nbytes:
            raise RuntimeError(f"a receiver got {got} of {nbytes} bytes")
        out.append(nbytes / (float(end) - start))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="50Mbps", help="link rate (default 50Mbps)")
    ap.add_argument(
        "--bytes", type=int, default=6_000_000, help="bytes per flow (default 6,000,000)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the patterns (default 2)")
    args = ap.parse_args()
    rate = parse_rate(args.rate)
    print(f"links shaped to {rate / 1e6:.3f} MB/s, {args.bytes:,} bytes per flow")
    with EmulatedCluster(3, rate, prefix="dttwg") as cluster:
        for rnd in range(args.rounds):
            for name, pairs in PATTERNS:
                got = goodputs(cluster, pairs, args.bytes)
                cells = "  ".join(f"{g / 1e6:.3f} MB/s ({g / rate:.1%})" for g in got)
                print(f"round {rnd + 1}  {name:18s} {cells}", flush=True)


if __name__ == "__main__":
    main()
