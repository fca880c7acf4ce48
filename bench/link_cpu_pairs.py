"""Does a shaped link's packet work cost as much per byte when more links are busy?

The calibration's link CPU benchmark (:mod:`realrun.linkcpu`) keeps one pair of hosts
exchanging 1 MiB messages both ways beside as many spinning processes as cores, and
charges what the spinners lose, less the ranks' own CPU, per byte carried. Here a
four-host emulated cluster (root and network namespaces needed) runs that round with
one pair busy and with two pairs busy at once, alternating, and prints each round's
lost cores, the ranks' cores, the bytes per second carried and the cost per byte and
end. A case with four busy links (p3 mlp_medium x4) is simulated with the one-pair
cost; docs/validation.md (nineteenth session) has what this showed. About 12 s a round.

    python bench/link_cpu_pairs.py                # 200 Mbit/s, 3 rounds
    python bench/link_cpu_pairs.py --rate 1Gbps --rounds 5
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from realrun import linkcpu
from simcore.units import parse_rate

SPIN_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="200Mbps", help="link rate (default 200Mbps)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = ap.parse_args()
    from realrun.netns import EmulatedCluster, terminate_as_interrupt

    cores = os.cpu_count() or 2
    rate = parse_rate(args.rate)
    with terminate_as_interrupt(), EmulatedCluster(4, rate, prefix="dtlcp") as emu:
        idle = linkcpu._spin(cores, SPIN_S)
        for rnd in range(args.rounds):
            for pairs in ([(0, 1)], [(0, 1), (2, 3)]):
                busy, outs = linkcpu._exchange(emu, cores, SPIN_S, pairs)
                after = linkcpu._spin(cores, SPIN_S)
                ref, idle = (idle + after) / 2, after
                seconds = max(o[3] for o in outs)
                lost = (ref - busy) / ref * cores
                ranks = sum(o[2] for o in outs) / seconds
                carried = sum(o[1] for o in outs) / seconds
                per_byte = (lost - ranks) / carried / 2 if carried else 0.0
                print(
                    f"round {rnd} pairs {len(pairs)}: lost {lost:.2f} cores, ranks "
                    f"{ranks:.2f}, carried {carried / 1e6:.1f} MB/s, {per_byte * 1e9:.2f} ns "
                    "a byte and end",
                    flush=True,
                )


if __name__ == "__main__":
    main()
