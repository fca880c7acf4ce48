"""Does a shaped link carry a flow as fast when traffic goes the other way too?

Builds three emulated hosts (:class:`realrun.netns.EmulatedCluster`; root and network
namespaces needed) with every link shaped to ``--rate``, and times TCP transfers of
``--bytes`` (:func:`realrun.netns.measure_goodputs`) in three
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
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from realrun.netns import EmulatedCluster, measure_goodputs
from simcore.units import parse_rate

PATTERNS = (
    ("alone 0->1", ((0, 1),)),
    ("both ways 0<->1", ((0, 1), (1, 0))),
    ("chain 0->1, 1->2", ((0, 1), (1, 2))),
)


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
                got = measure_goodputs(cluster, pairs, args.bytes)
                cells = "  ".join(f"{g / 1e6:.3f} MB/s ({g / rate:.1%})" for g in got)
                print(f"round {rnd + 1}  {name:18s} {cells}", flush=True)


if __name__ == "__main__":
    main()
