"""Does a shaped link's packet work cost as much per byte when more links are busy?

The calibration's link CPU benchmark (:func:`realrun.linkcpu.measure`; root and network
namespaces needed) keeps one pair of hosts, then two pairs at once, exchanging 1 MiB
messages both ways beside as many spinning processes as cores, and charges what the
spinners lose, less the ranks' own CPU, per byte carried. This prints every round of
both loads: lost cores, the ranks' cores, the bytes per second carried and the cost per
byte and end, then the medians the calibration keeps (``host.link_cpu_s_per_byte`` and
``host.link_cpu_two_pairs_s_per_byte``). docs/validation.md (nineteenth session) has what
this showed. About 10 s a round.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", default="200Mbps", help="link rate (default 200Mbps)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = ap.parse_args()
    row = linkcpu.measure(parse_rate(args.rate), os.cpu_count() or 2, rounds=args.rounds,
                          prefix="dtlcp")  # fmt: skip
    for name, load in (("one pair", row), ("two pairs", row["two_pairs"])):
        for rnd, (lost, ranks, nbytes, seconds) in enumerate(load["rounds"]):
            carried = nbytes / seconds
            per_byte = linkcpu.link_cpu_s_per_byte(
                {"lost_cores": lost, "ranks_cores": ranks, "bytes": nbytes, "seconds": seconds}
            )
            print(f"round {rnd} {name}: lost {lost:.2f} cores, ranks {ranks:.2f}, carried "
                  f"{carried / 1e6:.1f} MB/s, {per_byte * 1e9:.2f} ns a byte and end")  # fmt: skip
        print(f"{name}, median round: {linkcpu.link_cpu_s_per_byte(load) * 1e9:.2f} ns a byte "
              "and end")  # fmt: skip


if __name__ == "__main__":
    main()
