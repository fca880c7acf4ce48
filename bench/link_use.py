"""How busy were the shaped links of a validated case's real runs, and how did they share?

For each repeat of the cases of a ``sim validate`` output folder whose id starts with
the given prefix, this prints per host, over the measured iterations (from the kept
records alone, nothing is simulated):

- ``out`` and ``in``: the application bytes its ranks sent to and received from ranks
  on other hosts, per second, and that as a share of the goodput the case's
  calibration fitted to single messages (``measured.fits.goodput_bytes_per_s``);
- ``inbound``: the share of the time at least one message from another host was being
  received by one of its ranks (a receiving thread's span, from the message's header to
  its last payload byte; the parameter servers' messengers record these);
- ``senders``: the share of the time at least one of its ranks' sending threads was
  inside a blocking send (messengers only);
- ``arrival``: the median time a message of at least 100 KB from another host took
  from its header to its last byte, and its rate.

A link that carries less than its goodput while messages are being received nearly all
the time is shared by flows that each get little of it; a link that idles shows as a
low ``inbound``. docs/validation.md (twenty-first session) has what this found for the
``p3`` cases::

    python bench/link_use.py validation/ p3-mlp_medium-200Mbps
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

BIG_BYTES = 100_000
"""Messages at least this large count for ``arrival``."""


def covered_s(spans: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` spans."""
    total = 0.0
    start = end = None
    for s, e in sorted(spans):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return total + (end - start if end is not None else 0.0)


def link_use(records: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per host (its name in the records), over the measured iterations: ``out_bytes_per_s``,
    ``in_bytes_per_s``, ``inbound``, ``senders`` (shares of the time; NaN where no
    messenger recorded such spans, as in the collectives' runs), ``arrival_s`` and
    ``arrival_bytes_per_s`` (medians over messages of :data:`BIG_BYTES` or more; NaN
    without such messages)."""
    job = records["job"]
    warm, its = int(job["warmup_iterations"]), int(job["iterations"])
    ranks = records["ranks"]
    world = len(ranks)
    host = {int(r["rank"]): str(r.get("host", r["rank"])) for r in ranks}
    ends = ranks[0]["iteration_end"]
    begin, finish = ends[str(warm - 1)], ends[str(warm + its - 1)]
    window = finish - begin
    out: dict[str, float] = defaultdict(float)
    inn: dict[str, float] = defaultdict(float)
    inbound: dict[str, list[tuple[float, float]]] = defaultdict(list)
    sending: dict[str, list[tuple[float, float]]] = defaultdict(list)
    arrivals: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for r in ranks:
        me = host[int(r["rank"])]
        for dst, it, nbytes, _kind in r.get("sent") or ():
            if warm <= int(it) < warm + its and host[int(dst)] != me:
                out[me] += int(nbytes)
                inn[host[int(dst)]] += int(nbytes)
        for s in r["spans"]:
            stream, start, end, nbytes, flow = s[1], s[4], s[5], int(s[9]), int(s[10])
            if not begin <= start < finish:
                continue
            if stream == "send":
                sending[me].append((start, end))
            elif stream == "recv" and flow >= 0 and host[(flow >> 32) // world] != me:
                inbound[me].append((start, end))
                if nbytes >= BIG_BYTES and end > start:
                    arrivals[me].append((end - start, nbytes))
    res = {}
    for h in sorted(set(host.values()), key=lambda name: (len(name), name)):
        times = [t for t, _n in arrivals[h]]
        rates = [n / t for t, n in arrivals[h]]
        res[h] = {
            "out_bytes_per_s": out[h] / window,
            "in_bytes_per_s": inn[h] / window,
            "inbound": covered_s(inbound[h]) / window if inbound[h] else float("nan"),
            "senders": covered_s(sending[h]) / window if sending[h] else float("nan"),
            "arrival_s": statistics.median(times) if times else float("nan"),
            "arrival_bytes_per_s": statistics.median(rates) if rates else float("nan"),
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="a sim validate output folder")
    ap.add_argument("prefix", help="cases whose id starts with this (p3-mlp_medium-200Mbps)")
    args = ap.parse_args()
    from analysis.resolve import load_preset
    from analysis.validation.harness import kept_repeats, load_records

    for row, case, k, path in kept_repeats(args.out, args.prefix):
        if k == 0:
            calibration = os.path.join(args.out, "calibration", f"{case.bandwidth}.yaml")
            fits = load_preset(calibration)["measured"]["fits"]
            goodput = float(fits["goodput_bytes_per_s"])
            print(f"{row.point_id}: goodput {goodput / 1e6:.2f} MB/s ({case.bandwidth})")
        for h, u in link_use(load_records(path)).items():
            o, i = u["out_bytes_per_s"], u["in_bytes_per_s"]
            line = (
                f"  r{k} host {h}: out {o / 1e6:5.2f} MB/s ({o / goodput:4.0%}), in "
                f"{i / 1e6:5.2f} MB/s ({i / goodput:4.0%})"
            )
            if u["inbound"] == u["inbound"]:  # a messenger's spans (not NaN)
                line += f"; inbound {u['inbound']:4.0%}, senders {u['senders']:4.0%}"
            if u["arrival_s"] == u["arrival_s"]:
                line += (
                    f"; arrival {u['arrival_s'] * 1e3:5.1f} ms "
                    f"({u['arrival_bytes_per_s'] / 1e6:.1f} MB/s)"
                )
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
