"""How evenly concurrent flows share the emulated cluster's links, measured.

One TCP flow alone on a shaped link gets a steady share of the tbf rate (the calibration's
shaped ping-pong measures it). When every host sends at once, as in a ring collective, a
gossip exchange or a pipeline's stages, the flows do not all get that share, and some
fall behind others for seconds at a time: at low rates, where tbf's bucket holds a few
packets, the flows' rates spread by several per cent; where the links together carry
more than the machine's cores can move, every flow slows. A ring waits for its slowest
link and a partner for the slower direction, so the spread costs time a lone flow never
shows.

:func:`measure` builds a ``hosts``-host cluster and, at each rate given, alternates for
``rounds`` rounds one flow from host 0 to host 1 alone and a ring of flows ``r -> r + 1``
all at once (each host's uplink and downlink carry one flow each, so the flows share no
shaped queue). A flow carries ``duration_s`` worth of bytes at the rate; its receiver
times the middle of its bytes (:data:`WINDOW`), so tbf's first burst and the senders'
start-up lie outside. :func:`fit_spread` turns a rate's rounds into the two numbers the
simulator takes (:attr:`simcore.topology.Topology.flow_share` and ``flow_spread``): the
ring flows' mean goodput over the lone flow's, and their coefficient of variation within
a round; :func:`at` reads them at another rate.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from realrun.machine import busy_share, machine_cpu_s
from realrun.metrics import CPU_FLAG_SHARE

__all__ = ["HOSTS", "RATE_FRACTIONS", "ROUNDS", "WINDOW", "at", "fit_spread", "measure"]

HOSTS = 8
"""Hosts that send at once by default: the emulated matrices' usual rank count."""

RATE_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
"""The rates ``sim calibrate`` measures concurrent flows at, as shares of its own rate:
the spread depends on the rate (it grows as the rate falls; measurements in
docs/emulated_cluster.md), so a calibration moved to another rate takes the spread
measured nearest it (:func:`at`)."""

ROUNDS = 2
"""Rounds (a lone flow, then the ring) per rate. A rate whose ring kept the machine more
than :data:`realrun.metrics.CPU_FLAG_SHARE` busy (``cpu_bound``: the links together carry
more than the cores can move) is kept but not used (:func:`at`)."""

WINDOW = (0.1, 0.9)
"""The share of a flow's bytes between which its receiver times it."""

START_LEAD_S = 1.5
"""How long after the senders are started they all begin to send (they connect first)."""

_RECEIVER = r"""
import socket, sys, time
n, lo, hi = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
buf = memoryview(bytearray(1 << 20))
got, t_lo, t_hi = 0, None, None
while got < n:
    k = conn.recv_into(buf)
    if not k:
        break
    got += k
    if t_lo is None and got >= lo * n:
        t_lo, b_lo = time.monotonic(), got
    if t_hi is None and got >= hi * n:
        t_hi, b_hi = time.monotonic(), got
conn.close()
print(got, repr((b_hi - b_lo) / (t_hi - t_lo)) if t_hi and t_hi > t_lo else "nan", flush=True)
"""

_SENDER = r"""
import socket, sys, time
n, start = int(sys.argv[3]), float(sys.argv[4])
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])))
chunk = memoryview(b"\0" * (1 << 20))
while time.monotonic() < start:
    time.sleep(0.005)
left = n
while left > 0:
    left -= sock.send(chunk[:min(left, len(chunk))])
sock.shutdown(socket.SHUT_WR)
sock.recv(1)
"""


def _flows(
    cluster: Any, pairs: Sequence[tuple[int, int]], nbytes: int, timeout_s: float
) -> list[float]:
    """Goodput (bytes/s) of one flow per ``(src, dst)`` pair, all started at the same
    moment; each timed over :data:`WINDOW` of its bytes by its receiver."""
    hosts = cluster.hosts
    procs: list[subprocess.Popen[str]] = []
    try:
        receivers = []
        for _src, dst in pairs:
            argv = [
                sys.executable,
                "-c",
                _RECEIVER,
                hosts[dst].address,
                str(nbytes),
                *map(str, WINDOW),
            ]
            p = subprocess.Popen(
                cluster.command(dst, argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            receivers.append(p)
        ports = []
        for p in receivers:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if not line.isdigit():
                p.kill()
                raise RuntimeError(
                    f"a flow's receiver failed: {p.communicate(timeout=5)[1].strip()}"
                )
            ports.append(line)
        start = time.monotonic() + START_LEAD_S
        for (src, dst), port in zip(pairs, ports, strict=True):
            argv = [
                sys.executable,
                "-c",
                _SENDER,
                hosts[dst].address,
                port,
                str(nbytes),
                repr(start),
            ]
            procs.append(
                subprocess.Popen(
                    cluster.command(src, argv),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        rates = []
        for (src, dst), p in zip(pairs, receivers, strict=True):
            out, err = p.communicate(timeout=timeout_s)
            got, rate = out.split()
            if p.returncode != 0 or int(got) != nbytes or not math.isfinite(float(rate)):
                raise RuntimeError(
                    f"the flow h{src} -> h{dst} failed: {err.strip() or out.strip()}"
                )
            rates.append(float(rate))
        for p in procs[len(receivers) :]:
            p.wait(timeout=timeout_s)
        return rates
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def measure(
    rates_bytes_per_s: Sequence[float],
    hosts: int = HOSTS,
    rounds: int = ROUNDS,
    duration_s: float = 2.0,
    prefix: str | None = None,
) -> list[dict[str, Any]]:
    """One entry per rate: ``{"rate_bytes_per_s", "hosts", "share", "spread", "rounds":
    [{"single_bytes_per_s": the lone flow 0 -> 1's goodput, "ring_bytes_per_s": [flow
    r -> r + 1's goodput for each r]}, ...]}`` on one cluster of ``hosts`` hosts whose
    links are shaped to each rate in turn (see the module docs; ``share`` and ``spread``
    from :func:`fit_spread`). Needs root and network namespaces; the cluster is removed
    on return, failure or interrupt."""
    from realrun.netns import EmulatedCluster

    if hosts < 2:
        raise ValueError(f"hosts must be at least 2, got {hosts}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    rates = [float(r) for r in rates_bytes_per_s]
    if not rates or not all(r > 0 for r in rates) or not duration_s > 0:
        raise ValueError(f"give positive rates and a positive duration, got {rates_bytes_per_s}")
    timeout_s = 30.0 + 10.0 * duration_s
    prefix = prefix or os.environ.get("DTSIM_NETNS_PREFIX", "dtsim") + "f"
    ring = [(r, (r + 1) % hosts) for r in range(hosts)]
    out = []
    with EmulatedCluster(hosts, rates[0], prefix=prefix) as cluster:
        for rate in rates:
            cluster.set_rate(rate)
            nbytes = int(rate * duration_s)
            rows = []
            for _ in range(rounds):
                (single,) = _flows(cluster, [(0, 1)], nbytes, timeout_s)
                before = machine_cpu_s()
                ring_rates = _flows(cluster, ring, nbytes, timeout_s)
                rows.append(
                    {
                        "single_bytes_per_s": single,
                        "ring_bytes_per_s": ring_rates,
                        "machine_busy_share": _nan_if_none(busy_share(before, machine_cpu_s())),
                    }
                )
            share, spread = fit_spread(rows)
            busy = max((r["machine_busy_share"] for r in rows), default=math.nan)
            out.append(
                {
                    "rate_bytes_per_s": rate,
                    "hosts": hosts,
                    "share": share,
                    "spread": spread,
                    "machine_busy_share": busy,
                    "cpu_bound": bool(busy > CPU_FLAG_SHARE),
                    "rounds": rows,
                }
            )
    return out


def at(ladder: Sequence[Mapping[str, Any]], rate_bytes_per_s: float) -> tuple[float, float]:
    """``(share, spread)`` at ``rate_bytes_per_s`` from :func:`measure`'s entries: linear
    in the logarithm of the rate between the two measured rates around it, the nearest
    measured rate's outside them; the share at most 1 (no flow beats a lone one). An
    entry whose ring kept the machine's cores busy (``cpu_bound``) measured the cores,
    whose work the hosts' CPU model already charges, not the links: it is left out, and
    with none left the flows are even, ``(1.0, 0.0)``."""
    if not ladder:
        raise ValueError("no concurrent-flow measurements")
    points = sorted(
        (float(e["rate_bytes_per_s"]), float(e["share"]), float(e["spread"]))
        for e in ladder
        if not e.get("cpu_bound")
    )
    if not points:
        return 1.0, 0.0
    x = math.log(rate_bytes_per_s)
    if x <= math.log(points[0][0]):
        share, spread = points[0][1:]
    elif x >= math.log(points[-1][0]):
        share, spread = points[-1][1:]
    else:
        i = next(k for k in range(1, len(points)) if math.log(points[k][0]) >= x)
        (r0, s0, c0), (r1, s1, c1) = points[i - 1], points[i]
        w = (x - math.log(r0)) / (math.log(r1) - math.log(r0))
        share, spread = s0 + w * (s1 - s0), c0 + w * (c1 - c0)
    return min(share, 1.0), spread


def fit_spread(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """``(mean, spread)`` of concurrent flows from :func:`measure`'s rounds: ``mean`` is
    the ring flows' mean goodput over the lone flow's median, ``spread`` their coefficient
    of variation within a round (the within-round variances pooled, over the mean)."""
    if not rows:
        raise ValueError("no rounds to fit")
    single = float(np.median([r["single_bytes_per_s"] for r in rows]))
    flows = [np.asarray(r["ring_bytes_per_s"], dtype=float) for r in rows]
    mean = float(np.mean(np.concatenate(flows)))
    within = float(np.mean([f.var(ddof=1) if f.size > 1 else 0.0 for f in flows]))
    return mean / single, math.sqrt(within) / mean


def _nan_if_none(x: float | None) -> float:
    return math.nan if x is None else x
