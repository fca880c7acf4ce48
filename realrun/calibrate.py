"""Calibration of the simulator against this machine's (emulated) cluster.

:func:`calibrate` runs microbenchmarks as real gloo processes, one per emulated host, on the
cluster ``sim real --cluster netns --bandwidth R`` would build (or on loopback), fits what
the simulator needs, and returns a topology preset; :func:`write_calibration` writes it as
YAML for ``sim run --topology FILE``. What is measured:

* **Unshaped ping-pong** between host 0 and each other host (``hosts`` hosts) on the
  cluster before it is shaped (or loopback): the CPU seconds each side spends per message
  (``resource.getrusage``: all threads, user and kernel time), fitted as
  ``message_cpu_s + n * copy_cpu_s_per_byte``; the wall-time fit is kept too.
* **Local compute**, one torch thread: float32 ``add_`` over sizes (CPU seconds per byte
  reduced), ``copy_`` of a large tensor (memory bandwidth) and a float32 matmul (peak FLOP/s).
* **Shaped ping-pong** after the links are shaped in place
  (:meth:`~realrun.netns.EmulatedCluster.set_rate`): the one-way time of a message of ``n``
  bytes is half the median round trip. The model is ``t(n) = latency_s + max(0, n -
  burst) / goodput``: the latency is the tiny messages' time, the goodput a robust fit's
  slope (:func:`fit_shaped_link`).
* **All-reduce** (``dist.all_reduce``, float32) over sizes on the first ``p`` hosts for each
  ``p`` of ``allreduce_ranks``, shaped: medians kept for validation.
* **Busy cores**: hosts 0 and 1 all-reduce 256 KiB and 1 MiB beside 0 and 2 .. hosts
  threads training a small convolution; the wait of a woken thread for a core
  (``host.wakeup_s``) is fitted by simulating it (:func:`fit_wakeup`).
* **The scheduler**, first and without the cluster: ``cores + 1`` plain processes compute
  and sleep in turn (:mod:`realrun.scheduler`); the delay before an idle core takes over
  a thread queued on a busier one (``host.balance_s``) is fitted by simulating it.

The fitting functions (:func:`fit_line`, :func:`fit_latency_bandwidth`, :func:`fit_shaped_link`,
:func:`fit_cpu_cost`)
are pure numpy. Every rank runs ``python -m realrun.calibrate JOB.json`` (this module) with
the environment ``torchrun`` would give it; the parent process never imports torch.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun import flows, linkcpu, scheduler
from realrun.calibrated import (
    TCP_PAYLOAD_BYTES,
    burst_payload_bytes,
    format_rate_text,
    knob_sources,
)
from realrun.owner import temp_dir
from simcore.units import format_bytes, format_rate, parse_rate, parse_size

__all__ = [
    "DEFAULT_ALLREDUCE_RANKS",
    "DEFAULT_SIZES_BYTES",
    "CalibrationError",
    "LineFit",
    "burst_payload_bytes",
    "calibrate",
    "cpu_model",
    "describe",
    "fit_cpu_cost",
    "fit_latency_bandwidth",
    "fit_line",
    "fit_shaped_link",
    "format_rate_text",
    "memory_total_text",
    "pool_wakeup",
    "write_calibration",
]

KiB = 1024
MiB = 1024 * 1024
#: Message sizes of the ping-pong and all-reduce benchmarks: 4 B to 16 MiB.
DEFAULT_SIZES_BYTES: tuple[int, ...] = (
    4,
    64,
    1 * KiB,
    16 * KiB,
    64 * KiB,
    256 * KiB,
    1 * MiB,
    4 * MiB,
    16 * MiB,
)
DEFAULT_ALLREDUCE_RANKS: tuple[int, ...] = (2, 3, 4)
#: Sizes (bytes of one float32 array) of the reduction benchmark.
REDUCE_SIZES_BYTES: tuple[int, ...] = (64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB)
#: Bytes of the tensor copied to measure memory bandwidth (well beyond the caches).
COPY_BYTES = 64 * MiB
#: Side of the square float32 matrices multiplied to measure the FLOP rate.
MATMUL_N = 512
#: gloo's all-reduce segment (``kMaxSegmentSize`` in gloo/allreduce.h) and worker threads.
GLOO_SEGMENT = "1MiB"
GLOO_THREADS = 2
#: Messages up to this size are repeated SMALL_FACTOR times as often (they take
#: microseconds, and a busy machine's scheduling noise needs more samples to average out).
MESSENGER_SIZES_BYTES = (1 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
"""Payloads of the ping-pong through the runtime's messenger: the small ones show the
handshake, all of them the messenger's CPU per message and per byte (p3's slices are
about 200 KB, ps's shards a few MB)."""

HANDSHAKE_MAX_BYTES = 64 * KiB
"""The messenger sizes the handshake is taken from: a larger message's time beyond the
wire's line is TCP's (its window after the idle half of a round trip), not the
handshake's."""

SMALL_BYTES = 64 * KiB
SMALL_FACTOR = 4

SHARING_BYTES = 2 * MiB
"""Each flow's message in the two-flow benchmark (a parameter server's shards are a few
MB): host 0 sends it to host 1 over two TCP connections, the second starting later."""
SHARING_DELAYS = (0.1, 0.25, 0.5)
"""When the second flow of the two-flow benchmark starts, as shares of the first's time on
the shaped link alone."""
SHARING_WARMUP = 3
"""Untimed rounds first: the connections' congestion windows open as in a training run."""
SHARING_LEADS_S = tuple(i * 0.25e-3 for i in range(161))
"""The leads (:attr:`simcore.topology.Topology.link_lead_s`) tried when fitting the
two-flow benchmark: 0 to 40 ms."""
WAKEUP_SIZES_BYTES = (256 * KiB, 1 * MiB)
"""All-reduces of the busy-cores benchmark (a data-parallel run's buckets are a few
hundred KB to a few MB)."""
WAKEUP_REPEATS = 8
"""Timed all-reduces of the busy-cores benchmark per row, per ``--repeats``: a busy
machine's scheduling is noisy (with 4 the fitted wait ranged 1.35-1.8 ms over four
calibrations of one hour)."""
WAKEUP_PAUSE_S = 0.02
"""Idle time before each all-reduce of the busy-cores benchmark (the threads that carry it
go to sleep, as they do while a training step computes)."""
WAKEUP_GRID_S = tuple(round(i * 0.05e-3, 9) for i in range(101))
"""The wake-up waits (:attr:`simcore.topology.HostSpec.wakeup_s`) tried when fitting the
busy-cores benchmark: 0 to 5 ms."""
SEGMENT_BYTES = 64 * KiB
"""A TCP segment as the kernel hands it on (64 KiB with segmentation offload): the chunk
of the simulated network for a calibrated link whose tbf passes such segments whole
(:func:`segment_bytes`)."""
FRAME_CHUNK_BYTES = 16 * KiB
"""The chunk of the simulated network for a calibrated link whose tbf cuts segments into
frames (:func:`segment_bytes`)."""
#: Rank 0's progress line asking the parent to shape the links, and the file in the
#: job's folder by which the parent says it has.
SHAPE_LINE = "#shape"
SHAPED_FILE = "shaped"
#: Seconds a benchmark phase may go without reporting progress before it counts as hung
#: (each size and benchmark reports; slow links make whole phases far longer than this).
PHASE_TIMEOUT_S = 300.0


class CalibrationError(RuntimeError):
    """A calibration could not be made; the message is one line saying why."""


# ---------------------------------------------------------------------------------------
# Fitting


@dataclass(frozen=True)
class LineFit:
    """A straight line ``y = intercept + slope * x`` fitted to points.

    Attributes:
        intercept, slope: the fitted line.
        residual_rel_max: the largest ``|y - fit| / y`` over the points.
        residual_rel_median: the median of the same.
        points: how many points were fitted.
        weights_min: the smallest robust weight given to a point (1.0: no point was
            treated as an outlier).
    """

    intercept: float
    slope: float
    residual_rel_max: float
    residual_rel_median: float
    points: int
    weights_min: float

    def predict(self, x: float | np.ndarray) -> float | np.ndarray:
        """The fitted line at ``x``."""
        return self.intercept + self.slope * x


def _weighted_nonneg_lsq(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Minimise ``sum w (y - a - b x)^2`` with ``a >= 0`` and ``b >= 0`` (the optimum of a
    two-variable problem is either the unconstrained one or on a boundary)."""
    sw = np.sqrt(w)
    design = np.column_stack([np.ones_like(x), x]) * sw[:, None]
    (a, b), *_ = np.linalg.lstsq(design, y * sw, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    candidates = []
    wx2 = float(np.sum(w * x * x))
    if wx2 > 0:  # a = 0
        candidates.append((0.0, max(0.0, float(np.sum(w * x * y)) / wx2)))
    candidates.append((max(0.0, float(np.sum(w * y) / np.sum(w))), 0.0))  # b = 0
    return min(candidates, key=lambda ab: float(np.sum(w * (y - ab[0] - ab[1] * x) ** 2)))


#: Fewer points than this are fitted without down-weighting any (nothing to outvote them).
ROBUST_MIN_POINTS = 5


def fit_line(
    x: Sequence[float],
    y: Sequence[float],
    *,
    relative: bool = True,
    robust: bool = True,
    sigma: Sequence[float] | None = None,
    iterations: int = 50,
) -> LineFit:
    """Fit ``y = intercept + slope * x`` with both coefficients non-negative.

    ``relative``: minimise squared *relative* residuals ``(y - fit) / y``, so that a small
    ``y`` (a 4-byte message's microseconds) weighs as much as a large one (a 16 MiB
    message's tenths of a second); the intercept then comes from the small points and the
    slope from the large ones. ``robust`` (with at least :data:`ROBUST_MIN_POINTS` points):
    iteratively reweighted least squares with Huber weights (threshold 1.345 robust
    standard deviations of the scaled residuals), so a point disturbed by another process
    on the machine does not drag the line; if that leaves no slope while the plain fit has
    one, the plain fit is kept. ``sigma``: the
    uncertainty of each ``y`` (e.g. the standard error of a median); when given, residuals
    are scaled by it instead (weighted least squares), so precise points count more.
    Needs at least two distinct ``x`` and positive ``y`` when ``relative`` (positive
    ``sigma`` when given). Raises ``ValueError`` otherwise."""
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError("x and y must be sequences of the same length")
    if len(np.unique(xa)) < 2:
        raise ValueError("a line needs at least two distinct x values")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise ValueError("x and y must be finite")
    if relative and np.any(ya <= 0):
        raise ValueError("a relative fit needs positive y values")
    if sigma is not None:
        sa = np.asarray(sigma, dtype=float)
        if sa.shape != ya.shape or not np.all(sa > 0) or not np.all(np.isfinite(sa)):
            raise ValueError("sigma must hold one positive, finite value per point")
        base = 1.0 / sa**2
    else:
        base = 1.0 / ya**2 if relative else np.ones_like(ya)
    robust_w = np.ones_like(ya)
    a, b = _weighted_nonneg_lsq(xa, ya, base)
    plain = (a, b)
    if robust and len(xa) >= ROBUST_MIN_POINTS:
        for _ in range(iterations):
            r = (ya - a - b * xa) * np.sqrt(base)
            scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
            if not scale > 0:
                break
            k = 1.345 * scale
            new_w = np.where(np.abs(r) <= k, 1.0, k / np.maximum(np.abs(r), 1e-300))
            a2, b2 = _weighted_nonneg_lsq(xa, ya, base * new_w)
            robust_w = new_w
            done = abs(a2 - a) <= 1e-12 * max(abs(a), 1e-30) + 1e-18 and abs(b2 - b) <= (
                1e-12 * max(abs(b), 1e-30) + 1e-24
            )
            a, b = a2, b2
            if done:
                break
        if b == 0 < plain[1]:
            # the points that carry the slope were down-weighted as outliers: with so few
            # of them the robust fit has nothing to judge by, so keep the plain one
            (a, b), robust_w = plain, np.ones_like(ya)
    fitted = a + b * xa
    denom = np.where(ya != 0, np.abs(ya), 1.0)
    rel = np.abs(ya - fitted) / denom
    return LineFit(
        float(a),
        float(b),
        float(np.max(rel)),
        float(np.median(rel)),
        len(xa),
        float(np.min(robust_w)),
    )


def fit_latency_bandwidth(
    sizes_bytes: Sequence[float],
    one_way_s: Sequence[float],
    burst_bytes: float = 0.0,
    sigma_s: Sequence[float] | None = None,
) -> tuple[float, float, LineFit]:
    """``(latency_s, goodput_bytes_per_s, fit)`` from one-way message times: the robust
    relative fit of ``t(n) = latency_s + max(0, n - burst_bytes) / goodput``.

    ``burst_bytes``: payload bytes a shaped link passes at once before its rate applies
    (tbf's bucket, full again after a ping-pong's idle half): a message of ``n`` bytes
    waits for the rate only for its bytes beyond the bucket, so without this term the
    line through large messages has a negative intercept and a too-steep fit elsewhere.
    ``goodput`` is then the sustained rate that back-to-back traffic gets. 0 for an
    unshaped link. ``sigma_s``: each time's uncertainty (see :func:`fit_line`; default: a
    relative fit). Raises ``ValueError`` when the times do not grow with the size (no
    bandwidth can be read from them)."""
    if not (burst_bytes >= 0 and math.isfinite(burst_bytes)):
        raise ValueError(f"burst_bytes must be non-negative and finite, got {burst_bytes!r}")
    x = np.maximum(np.asarray(sizes_bytes, dtype=float) - burst_bytes, 0.0)
    fit = fit_line(x, one_way_s, sigma=sigma_s)
    if not fit.slope > 0:
        raise ValueError("the message times do not grow with the size; no bandwidth to fit")
    return fit.intercept, 1.0 / fit.slope, fit


LATENCY_MAX_BYTES = 1024
"""Ping-pong sizes whose one-way time is the link's latency (far below a packet and tbf's
bucket)."""


def fit_shaped_link(
    sizes_bytes: Sequence[float],
    one_way_s: Sequence[float],
    burst_bytes: float,
    sigma_s: Sequence[float],
) -> tuple[float, float, LineFit]:
    """``(latency_s, goodput_bytes_per_s, fit)`` of a shaped link: the goodput of
    :func:`fit_latency_bandwidth`, whose slope the large messages set, and the latency
    read directly, the shortest of the median one-way times of the sizes of at most
    :data:`LATENCY_MAX_BYTES` (tbf's bucket passes them at once; another process on the
    machine only ever lengthens a time). The fit's free intercept is not used as the
    latency, since the medium sizes (16-256 KiB, slower than the bucket model) pull it
    about from one calibration to the next (docs/emulated_cluster.md). ``fit`` is the line
    with that latency; without such small sizes, the plain fit."""
    latency, goodput, fit = fit_latency_bandwidth(sizes_bytes, one_way_s, burst_bytes, sigma_s)
    sizes = np.asarray(sizes_bytes, dtype=float)
    times = np.asarray(one_way_s, dtype=float)
    small = sizes <= LATENCY_MAX_BYTES
    if not small.any():
        return latency, goodput, fit
    latency = float(np.min(times[small]))
    fitted = latency + np.maximum(sizes - burst_bytes, 0.0) / goodput
    rel = np.abs(times - fitted) / np.abs(times)
    line = LineFit(latency, fit.slope, float(rel.max()), float(np.median(rel)), len(times), 1.0)
    return latency, goodput, line


def fit_messenger_cpu(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(p2p_message_cpu_s, p2p_copy_cpu_s_per_byte)`` from ``(bytes, CPU seconds)``
    of messages through the messenger beyond a plain send's: a straight line with
    non-negative coefficients (least squares on absolute residuals, since the excess of
    a small message can be near zero or below it; robust weights from
    :data:`ROBUST_MIN_POINTS` points on, so not with the calibration's four sizes). With
    fewer than two sizes: the median as the per-message cost and no per-byte one;
    ``(0, 0)`` without points."""
    if not points:
        return 0.0, 0.0
    xs = [float(n) for n, _ in points]
    ys = [float(c) for _, c in points]
    if len(set(xs)) < 2:
        return max(0.0, _median(ys)), 0.0
    fit = fit_line(xs, ys, relative=False)
    return fit.intercept, fit.slope


def fit_cpu_cost(
    sizes_bytes: Sequence[float], cpu_s: Sequence[float]
) -> tuple[float, float, LineFit]:
    """``(message_cpu_s, copy_cpu_s_per_byte, fit)``: CPU seconds per message and side,
    fitted robustly as ``message_cpu_s + n * copy_cpu_s_per_byte``."""
    fit = fit_line(sizes_bytes, cpu_s)
    return fit.intercept, fit.slope, fit


def segment_bytes(preset: Mapping[str, Any]) -> int:
    """The chunk of the simulated network for a calibrated link (``preset``'s
    ``network.burst``; here and in ``sim validate``). The kernel hands tbf 64 KiB segments
    (:data:`SEGMENT_BYTES`); tbf passes a segment whole when its bucket holds one and
    otherwise cuts it into frames, which the receiver's shaped hop then forwards frame by
    frame: 16 KiB chunks then (:data:`FRAME_CHUNK_BYTES`), which store-and-forward at
    that second hop about as frames would, at a tenth of their events
    (docs/emulated_cluster.md). A link without a bucket (unshaped) carries whole
    segments."""
    from simcore.units import parse_size

    burst = parse_size((preset.get("network") or {}).get("burst", 0) or 0)
    return FRAME_CHUNK_BYTES if 0 < burst < SEGMENT_BYTES else SEGMENT_BYTES


def tcp_send_buffer_bytes() -> int:
    """The most a TCP socket's send buffer grows to here (``net.ipv4.tcp_wmem``'s maximum;
    4 MiB, Linux's default, where it cannot be read): what a blocking send hands the
    kernel before it returns."""
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem", encoding="ascii") as fh:
            return int(fh.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 << 20


ROUTE_LINKS = 2
"""Network links between two hosts of the emulated cluster (host to switch, switch to
host): the preset's per-link latency is the measured one-way latency over this."""

SEND_BUFFER_MIN_BYTES = 4 * MiB
"""Smallest shaped ping-pong size whose send returns measure the socket's send buffer:
larger than any buffer the kernel grows to here, so every such send waits for the wire."""


def send_buffer_bytes(returns: Sequence[tuple[int, float]], goodput_bytes_per_s: float) -> int:
    """How much of a message a blocking send hands the kernel before it returns, from
    ``(bytes, median seconds the send took to return)`` of shaped ping-pongs: a send of
    ``n`` bytes returns once all but the buffer's worth has gone at the link's goodput,
    so the buffer is ``n - returned_s * goodput`` (the median over the sizes of at least
    :data:`SEND_BUFFER_MIN_BYTES`). Linux grows a connection's buffer with its congestion
    window up to ``net.ipv4.tcp_wmem``'s maximum: 3.4-3.6 MB of 4 MiB here on the
    calibration's long-lived connections, about 1.3 MB on a new connection's first big
    sends. Without such sizes (or unshaped): that maximum."""
    est = [
        min(float(n), max(0.0, n - t * goodput_bytes_per_s))
        for n, t in returns
        if n >= SEND_BUFFER_MIN_BYTES and math.isfinite(t)
    ]
    return round(_median(est)) if est else tcp_send_buffer_bytes()


def sharing_delays_s(rate_bytes_per_s: float) -> list[float]:
    """The two-flow benchmark's delays on a link shaped to ``rate_bytes_per_s``: shares
    (:data:`SHARING_DELAYS`) of a :data:`SHARING_BYTES` message's time at the TCP goodput
    of that rate."""
    from realrun.netns import FRAME_BYTES

    alone = SHARING_BYTES / (rate_bytes_per_s * TCP_PAYLOAD_BYTES / FRAME_BYTES)
    return [f * alone for f in SHARING_DELAYS]


def sharing_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per delay of the two-flow benchmark (rank 0's and rank 1's ``sharing`` results):
    the median delay the second flow really started after the first, and the median
    times, from the first flow's start, until each flow's last byte arrived.

    Only the rounds that measured two flows sharing an empty link count: a round whose
    first flow started before the previous round's last byte arrived (a stalled
    receiver let the rounds overlap), or whose second flow started only after the first
    flow's message was through (its thread waited that long for a core), measured
    something else. A delay none of whose rounds count has no row."""
    sent = next((r["sharing"] for r in results if "first_start_s" in r.get("sharing", {})), None)
    got = next((r["sharing"] for r in results if "first_done_s" in r.get("sharing", {})), None)
    if sent is None or got is None:
        return []

    def counts(k: int) -> bool:
        link_empty = k == 0 or sent["first_start_s"][k] >= max(
            got["first_done_s"][k - 1], got["second_done_s"][k - 1]
        )
        return link_empty and sent["second_start_s"][k] < got["first_done_s"][k]

    rows = []
    skip = int(sent["warmup"])
    plan = sent["delays_s"]
    for d in sorted(set(plan[skip:])):
        ks = [k for k in range(skip, len(plan)) if plan[k] == d and counts(k)]
        if not ks:
            continue
        a0 = [sent["first_start_s"][k] for k in ks]
        rows.append(
            {
                "delay_s": _median([sent["second_start_s"][k] - a for k, a in zip(ks, a0)]),
                "first_s": _median([got["first_done_s"][k] - a for k, a in zip(ks, a0)]),
                "second_s": _median([got["second_done_s"][k] - a for k, a in zip(ks, a0)]),
            }
        )
    return rows


def simulate_two_flows(
    preset: Mapping[str, Any], nbytes: int, delay_s: float, lead_s: float
) -> tuple[float, float]:
    """The two-flow benchmark simulated on a two-host cluster of ``preset`` whose links
    let flows already sending go on ``lead_s`` (``network.lead``) before a newcomer's
    turn: when the first flow's message (host 0's rank to host 1's) and the second's (the
    hosts' other devices, started ``delay_s`` later) have arrived."""
    from simpy import Environment

    from simcore.network import DetailedNetwork
    from simcore.topology import TopologySpec, build_topology

    net_section = {**preset["network"], "sharing": "fair", "lead": lead_s}
    topo = build_topology(TopologySpec({**preset, "network": net_section}, 2))
    env = Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=segment_bytes(preset))
    done = [math.nan, math.nan]

    def arrived(flow: int) -> Callable[[Any], None]:
        return lambda _msg: done.__setitem__(flow, env.now)

    net.send(topo.gpus[0], topo.gpus[1], nbytes, arrived(0))
    later = env.timeout(delay_s)
    later.callbacks.append(lambda _e: net.send(topo.hosts[0], topo.hosts[1], nbytes, arrived(1)))
    env.run()
    return done[0], done[1]


def fit_sharing_lead(
    preset: Mapping[str, Any], nbytes: int, rows: Sequence[Mapping[str, float]]
) -> tuple[float, float]:
    """``(lead_s, residual_rel_max)``: the lead of :data:`SHARING_LEADS_S` whose
    simulated two-flow benchmark (:func:`simulate_two_flows`) is closest to the measured
    ``rows`` (:func:`sharing_rows`; least squares of both flows' relative errors), and
    the largest relative error left."""
    if not rows:
        raise ValueError("the two-flow benchmark has no rows")
    best: tuple[float, float, float] | None = None
    for lead in SHARING_LEADS_S:
        errs = []
        for row in rows:
            a, b = simulate_two_flows(preset, nbytes, row["delay_s"], lead)
            errs += [a / row["first_s"] - 1, b / row["second_s"] - 1]
        cost = float(sum(e * e for e in errs))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, lead, max(abs(e) for e in errs))
    assert best is not None
    return best[1], best[2]


def wakeup_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per size and number of computing threads (0: idle) of the busy-cores benchmark
    (rank 0's ``wakeup`` results): the median all-reduce time."""
    got = next((r["wakeup"] for r in results if r.get("rank") == 0 and r.get("wakeup")), None)
    if not got:
        return []
    return sorted(
        (
            {
                "bytes": int(row["bytes"]),
                "threads": int(row["threads"]),
                "time_s": _median(row["times_s"]),
            }
            for row in got
            if row["times_s"]
        ),
        key=lambda r: (r["bytes"], r["threads"]),
    )


def simulate_busy_allreduce(
    preset: Mapping[str, Any], nbytes: int, threads: int, wakeup_s: float
) -> float:
    """The busy-cores benchmark simulated on a two-host cluster of ``preset`` whose woken
    threads wait ``wakeup_s`` per computing thread per core while compute takes every
    core: how long an all-reduce of ``nbytes`` between the hosts' ranks takes beside
    ``threads`` threads computing throughout (0: idle cores)."""
    from simpy import Environment

    from simcore.collectives import Collectives
    from simcore.engine import cpu_pools
    from simcore.network import DetailedNetwork
    from simcore.topology import TopologySpec, build_topology
    from simcore.transport import CommCpu, HostTransport

    host = {**preset["host"], "wakeup_s": wakeup_s}
    topo = build_topology(TopologySpec({**preset, "host": host}, 2))
    assert topo.host_spec is not None
    env = Environment()
    net = DetailedNetwork(env, topo, chunk_bytes=segment_bytes(preset))
    pool_of = cpu_pools(env, topo)
    transport = HostTransport(net, CommCpu(topo.host_spec, pool_of))
    for i in range(threads):  # the ranks' main threads compute throughout
        pool_of(topo.gpus[i % len(topo.gpus)]).run(1e9, lambda: None, holds=True)
    done = env.event()
    Collectives(net, transport).allreduce([0, 1], nbytes, "ring", lambda t: done.succeed(t))
    env.run(until=done)
    return float(done.value)


def unshaped_links(
    preset: Mapping[str, Any], latency_s: float, goodput_bytes_per_s: float
) -> dict[str, Any]:
    """``preset`` with its network unshaped: the ``latency_s`` and goodput a message
    between two hosts sees on unshaped veths (the calibration's wall-time fit), no tbf
    bucket, no lead. The busy-cores benchmark runs on such links."""
    network = {
        k: v for k, v in preset["network"].items() if k not in ("burst", "peak_bandwidth", "lead")
    }
    network["bandwidth"] = format_rate_text(goodput_bytes_per_s)
    network["latency"] = _time_text(max(latency_s, 0.0) / ROUTE_LINKS)
    return {**preset, "network": network}


def fit_wakeup(
    preset: Mapping[str, Any], rows: Sequence[Mapping[str, float]]
) -> tuple[float, float]:
    """``(wakeup_s, residual_s_max)``: the wait of :data:`WAKEUP_GRID_S` whose simulated
    busy-cores benchmark (:func:`simulate_busy_allreduce`) slows the all-reduces down by
    what the measured ``rows`` (:func:`wakeup_rows`) show, each number of computing
    threads against idle cores for that size (least squares), and the largest
    difference left, in seconds."""
    return fit_wakeup_pooled([(preset, rows)])


def fit_wakeup_pooled(
    benchmarks: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, float]]]],
) -> tuple[float, float]:
    """:func:`fit_wakeup` over several runs of the busy-cores benchmark at once, each
    ``(preset, rows)`` simulated on its own links: the one wait whose slow-downs are
    nearest to all of them (least squares over every row), and the largest difference
    left. The wait is the host's, not the link's: runs of the benchmark by calibrations
    at other link rates measure the same thing, and a busy machine's scheduling moves
    between runs a minute apart (see :func:`pool_wakeup`)."""
    sets = []
    for preset, rows in benchmarks:
        idle = {int(r["bytes"]): float(r["time_s"]) for r in rows if int(r["threads"]) == 0}
        busy = [r for r in rows if int(r["threads"]) > 0 and int(r["bytes"]) in idle]
        if not busy:
            raise ValueError("the busy-cores benchmark has no rows with and without compute")
        sim_idle = {n: simulate_busy_allreduce(preset, n, 0, 0.0) for n in idle}
        sets.append((preset, idle, busy, sim_idle))
    best: tuple[float, float, float] | None = None
    for wake in WAKEUP_GRID_S:
        errs = []
        for preset, idle, busy, sim_idle in sets:
            for r in busy:
                n, t = int(r["bytes"]), int(r["threads"])
                sim = simulate_busy_allreduce(preset, n, t, wake) - sim_idle[n]
                errs.append(sim - (float(r["time_s"]) - idle[n]))
        cost = float(sum(e * e for e in errs))
        if best is None or cost < best[0] - 1e-15:
            best = (cost, wake, max(abs(e) for e in errs))
    assert best is not None
    return best[1], best[2]


def pool_wakeup(presets: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``presets`` (calibrated, as :func:`calibrate` returns them) with one wake-up wait
    (``host.wakeup_s``) fitted to all of their busy-cores benchmarks
    (:func:`fit_wakeup_pooled`, each on the unshaped links it ran on), their own fits
    kept as ``measured.fits.wakeup_own_s``. Presets without the benchmark are returned
    as they are, and so is a single one. Fitting again from the own fits' rows gives
    the same result, so pooling twice changes nothing."""
    out = [json.loads(json.dumps(p)) for p in presets]
    have = [p for p in out if (p.get("measured") or {}).get("wakeup")]
    if len(have) < 2:
        return out
    benchmarks = []
    for p in have:
        fits = p["measured"]["fits"]
        links = unshaped_links(
            p, float(fits["unshaped_latency_s"]), float(fits["unshaped_goodput_bytes_per_s"])
        )
        benchmarks.append((links, p["measured"]["wakeup"]))
    wake, residual = fit_wakeup_pooled(benchmarks)
    for p in have:
        fits = p["measured"]["fits"]
        fits.setdefault("wakeup_own_s", fits.get("wakeup_s", p["host"].get("wakeup_s")))
        fits["wakeup_s"] = wake
        fits["wakeup_residual_s_max"] = residual
        fits["wakeup_pooled_over"] = len(have)
        p["host"]["wakeup_s"] = wake
    return out


SHAPED_CPU_MIN_BYTES = 1 << 20
"""Smallest ping-pong size whose machine-wide CPU enters the shaped per-byte fit."""


def machine_busy_s() -> float:
    """CPU seconds every core of this machine has been busy since boot (``/proc/stat``,
    all but idle and iowait; 10 ms resolution): a shaped link's packet work runs in the
    kernel's soft interrupts, charged to whatever runs or to no process at all."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _median_error(samples: Sequence[float], floor_rel: float = 0.005) -> float:
    """The standard error of the median of ``samples``: 1.253 times the robust standard
    deviation (1.4826 MAD) over the square root of their count, at least ``floor_rel`` of
    the median (the timer and a handful of samples resolve no better)."""
    arr = np.asarray(samples, dtype=float)
    med = float(np.median(arr))
    sd = 1.4826 * float(np.median(np.abs(arr - med)))
    return max(1.253 * sd / math.sqrt(len(arr)), floor_rel * abs(med), 1e-9)


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


# ---------------------------------------------------------------------------------------
# Text forms the preset parsers read back (simcore.units)


def _time_text(seconds: float) -> str:
    """A duration as ``parse_time`` reads it: ``52.3us``."""
    return f"{seconds * 1e6:.4g}us"


def _rate_name(bytes_per_s: float) -> str:
    """``125e6`` -> ``1Gbps`` for preset names (bits per second, no spaces)."""
    bits = bytes_per_s * 8
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.4g}{prefix}bps"
    return f"{bits:.4g}bps"


# ---------------------------------------------------------------------------------------
# The machine


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_total_text() -> str:
    """The machine's memory (MemTotal of /proc/meminfo) as ``parse_size`` reads it."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return f"{kib / 2**20:.3f}GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.3f}GiB"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


# ---------------------------------------------------------------------------------------
# Running the ranks


def _check_args(
    cluster: str,
    bandwidth_bytes_per_s: float | None,
    hosts: int,
    sizes_bytes: Sequence[int],
    repeats: int,
    allreduce_ranks: Sequence[int],
) -> None:
    """``ValueError`` naming the first bad argument and what is allowed."""
    if cluster not in ("netns", "local"):
        raise ValueError(f"cluster: {cluster!r} is not allowed; choose one of: netns, local")
    if bandwidth_bytes_per_s is not None:
        if cluster == "local":
            raise ValueError(
                "bandwidth: a local calibration runs on unshaped loopback; give a bandwidth "
                "only with cluster netns"
            )
        if not (bandwidth_bytes_per_s > 0 and math.isfinite(bandwidth_bytes_per_s)):
            raise ValueError(
                f"bandwidth: {bandwidth_bytes_per_s!r} is not allowed; it must be a positive, "
                "finite rate"
            )
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 2 <= hosts <= 64:
        raise ValueError(f"hosts: {hosts!r} is not allowed; it must be an integer from 2 to 64")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= 1000:
        raise ValueError(
            f"repeats: {repeats!r} is not allowed; it must be an integer from 1 to 1000"
        )
    sizes = list(sizes_bytes)
    if len({max(4, 4 * (int(s) // 4)) for s in sizes}) < 2 or any(
        isinstance(s, bool) or int(s) != s or not 1 <= s <= 1 << 30 for s in sizes
    ):
        raise ValueError(
            f"sizes: {sizes!r} is not allowed; give at least two different whole sizes "
            "from 4 bytes to 1 GiB"
        )
    ranks = list(allreduce_ranks)
    if any(isinstance(p, bool) or not isinstance(p, int) or not 2 <= p <= 64 for p in ranks):
        raise ValueError(
            f"allreduce_ranks: {ranks!r} is not allowed; give integers from 2 to 64 (or none)"
        )


def _element_count(n: int) -> int:
    """float32 elements of a message of about ``n`` bytes (at least one)."""
    return max(1, int(n) // 4)


def _run_phase(
    job: Mapping[str, Any],
    world: int,
    wrap: Callable[[int, list[str]], list[str]],
    master_addr: str,
    ifname: Callable[[int], str],
    out_dir: str,
    tick: Callable[[str], None],
    reshape: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Start ``world`` ranks of ``python -m realrun.calibrate`` (rank ``r`` on host ``r``),
    follow rank 0's progress lines, and return every rank's results. At the job's
    ``shape`` step the ranks wait while ``reshape()`` shapes the links."""
    from realrun.launch import RankFailed, free_port, last_error, stop

    os.makedirs(out_dir, exist_ok=True)
    job_path = os.path.join(out_dir, "job.json")
    with open(job_path, "w", encoding="utf-8") as fh:
        json.dump({**job, "out": out_dir}, fh)
    progress_path = os.path.join(out_dir, "progress")
    open(progress_path, "w").close()
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(port),
                GLOO_SOCKET_IFNAME=ifname(rank),
                OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
                CUDA_VISIBLE_DEVICES="",
            )
            log = open(os.path.join(out_dir, f"rank{rank}.log"), "wb")  # noqa: SIM115
            logs.append(log)
            argv = [sys.executable, "-m", "realrun.calibrate", job_path]
            procs.append(
                subprocess.Popen(
                    wrap(rank, argv),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        seen = 0
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            codes = [p.poll() for p in procs]
            with open(progress_path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            for line in lines[seen:]:
                if line == SHAPE_LINE:
                    if reshape is not None:
                        reshape()
                    open(os.path.join(out_dir, SHAPED_FILE), "w").close()
                else:
                    tick(line)
            if len(lines) > seen:
                deadline = time.monotonic() + PHASE_TIMEOUT_S
            seen = max(seen, len(lines))
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    raise RankFailed(
                        rank,
                        f"calibration rank {rank} exited with code {code}: "
                        f"{last_error(os.path.join(out_dir, f'rank{rank}.log'))}",
                    )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                raise RankFailed(
                    0, f"calibration ranks reported no progress for {PHASE_TIMEOUT_S:g} s"
                )
            time.sleep(0.05)
    finally:
        stop(procs)
        for log in logs:
            log.close()
    results = []
    for rank in range(world):
        with open(os.path.join(out_dir, f"result{rank}.json"), encoding="utf-8") as fh:
            results.append(json.load(fh))
    return results


def _steps(job: Mapping[str, Any]) -> int:
    """Progress lines rank 0 writes for ``job``."""
    n = len(job["sizes"])
    count = {
        "pingpong": n * len(job["pairs"]),
        "allreduce": n * len(job["allreduce_ranks"]),
        "compute": 3,
        "shape": 0,
        "messenger": len(MESSENGER_SIZES_BYTES),
        "sharing": 1,
        "wakeup": 1,
    }
    return sum(count[step.split(":")[0]] for step in job["steps"])


def _in_cluster(
    cluster: str,
    rate: float | None,
    hosts: int,
    job: Mapping[str, Any],
    out_dir: str,
    tick: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``job`` on ``hosts`` hosts: loopback (``local``) or an emulated cluster built
    unshaped and shaped to ``rate`` at the job's ``shape`` step (removed again on every way
    out). Returns the ranks' results and, for a shaped cluster, the tbf counters."""
    if cluster == "local":
        res = _run_phase(job, hosts, lambda _h, argv: argv, "127.0.0.1", lambda _h: "lo",
                         out_dir, tick)  # fmt: skip
        return res, []
    from realrun.netns import EmulatedCluster, terminate_as_interrupt

    prefix = os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
    with terminate_as_interrupt(), EmulatedCluster(hosts, None, prefix=prefix) as emu:
        res = _run_phase(
            job,
            hosts,
            emu.command,
            emu.hosts[0].address,
            lambda h: emu.hosts[h].ifname,
            out_dir,
            tick,
            lambda: emu.set_rate(rate),
        )
        return res, emu.qdisc_stats() if rate is not None else []


def calibrate(
    cluster: str = "netns",
    bandwidth_bytes_per_s: float | None = None,
    hosts: int = 2,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 5,
    allreduce_ranks: Sequence[int] = DEFAULT_ALLREDUCE_RANKS,
    progress: Callable[[int, int, str], None] | None = None,
    flow_hosts: int = flows.HOSTS,
) -> dict[str, Any]:
    """Calibrate the simulator on this machine's cluster; returns the preset mapping (see
    the module docs and docs/emulated_cluster.md for the schema).

    ``cluster``: ``netns`` (one network namespace per host, root needed; links shaped to
    ``bandwidth_bytes_per_s`` in each direction, unshaped when None) or ``local`` (loopback,
    no bandwidth). ``hosts``: the ping-pong runs between host 0 and each of hosts 1 ..
    hosts-1. ``sizes_bytes``: message sizes (rounded down to whole float32 elements).
    ``repeats``: timed repetitions per size after one warm-up. ``allreduce_ranks``: the
    all-reduce is timed on the first ``p`` hosts for each ``p``. ``progress(done, total,
    what)`` is called as benchmarks finish. ``flow_hosts``: hosts that send at once in the
    concurrent-flow benchmark (shaped links only, :mod:`realrun.flows`).

    Raises ``ValueError`` for a bad argument (naming it), ``NetnsUnavailable`` when netns
    cannot be used here, ``RankFailed`` when a benchmark process fails, and
    :class:`CalibrationError` when the measurements cannot be fitted twice in a row (a
    measurement that cannot be fitted is taken once more)."""
    _check_args(cluster, bandwidth_bytes_per_s, hosts, sizes_bytes, repeats, allreduce_ranks)
    if isinstance(flow_hosts, bool) or not isinstance(flow_hosts, int) or not 2 <= flow_hosts <= 64:
        raise ValueError(
            f"flow_hosts: {flow_hosts!r} is not allowed; it must be an integer from 2 to 64"
        )
    if cluster == "netns":
        from realrun.netns import check_available

        check_available()
    sizes = sorted({4 * _element_count(int(s)) for s in sizes_bytes})
    ar_ranks = sorted(set(allreduce_ranks))
    world = max([hosts, *ar_ranks])
    shaped = cluster == "netns" and bandwidth_bytes_per_s is not None
    # one set of processes on one cluster: unshaped first (ping-pong with CPU times, the
    # compute benchmarks while the other ranks wait), then shaped where a rate is given
    # (the messenger's CPU is taken unshaped: over a shaped link its threads also burn
    # CPU while a message is in flight, which does not carry over to a training run's
    # many messages at once; the shaped link's own cost per byte is the preset's)
    # (the busy-cores all-reduce too: how long a woken thread waits for a core is the
    # machine's scheduler, measured where the link adds least; beside busy cores a
    # 200 Mbit/s link also slows for its soft interrupts, which is not a wait)
    steps = ["pingpong:unshaped", "compute", "wakeup"]
    steps += ["messenger:unshaped", "shape", "pingpong:shaped", "sharing"] if shaped else []
    steps += ["messenger:idle", "messenger:busy", "allreduce"]
    job = {
        "sizes": sizes,
        "repeats": repeats,
        "pairs": [[0, h] for h in range(1, hosts)],
        "allreduce_ranks": ar_ranks,
        "steps": steps,
        "sharing_delays_s": sharing_delays_s(bandwidth_bytes_per_s) if shaped else [],
    }
    # and the scheduler benchmark, first; the link's CPU and the concurrent flows, shaped
    total = _steps(job) + 1 + 2 * shaped
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, what)

    # A busy machine can leave a benchmark without the trend its fit needs (message times
    # that do not grow with the size): measure once more before giving up.
    def measure_and_fit() -> dict[str, Any]:
        started = datetime.datetime.now(datetime.UTC)
        t0 = time.monotonic()
        sched_rows, results, qdiscs, link_row, flow_rows = _measure(
            cluster, bandwidth_bytes_per_s if shaped else None, world, job, tick, flow_hosts
        )
        return _preset(
            cluster=cluster,
            rate=bandwidth_bytes_per_s,
            hosts=world,
            sizes=sizes,
            repeats=repeats,
            results=results,
            qdiscs=qdiscs,
            started=started,
            wall_s=time.monotonic() - t0,
            scheduler_rows=sched_rows,
            link_row=link_row,
            flow_rows=flow_rows,
        )

    try:
        return measure_and_fit()
    except CalibrationError:
        return measure_and_fit()


def _measure(
    cluster: str,
    rate: float | None,
    world: int,
    job: Mapping[str, Any],
    tick: Callable[[str], None],
    flow_hosts: int = flows.HOSTS,
) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]], Any, Any]:
    """Run every benchmark of a calibration once: ``(scheduler rows, the ranks' results,
    qdisc counters, the shaped link's CPU row or None, the concurrent flows' rounds or
    None)``; ``rate`` None: unshaped."""
    # the machine's scheduler, on its own before any rank starts (plain processes)
    try:
        sched_rows = scheduler.measure(_cores())
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
        raise CalibrationError(f"the scheduler benchmark failed: {err}") from None
    tick("scheduler benchmark")
    work = temp_dir("calibrate")
    try:
        results, qdiscs = _in_cluster(cluster, rate, world, dict(job), work, tick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    link_row = flow_rows = None
    if rate is not None:  # the shaped link's packet work beside computing processes
        try:
            link_row = linkcpu.measure(
                float(rate),
                _cores(),
                prefix=os.environ.get("DTSIM_NETNS_PREFIX", "dtsim") + "l",
            )
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
            raise CalibrationError(f"the link CPU benchmark failed: {err}") from None
        tick("link CPU benchmark")
        try:  # how evenly flows share the links when every host sends at once
            flow_rows = flows.measure(
                [float(rate) * f for f in flows.RATE_FRACTIONS],
                flow_hosts,
                flows.ROUNDS,
                prefix=os.environ.get("DTSIM_NETNS_PREFIX", "dtsim") + "f",
            )
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as err:
            raise CalibrationError(f"the concurrent-flow benchmark failed: {err}") from None
        tick("concurrent flows")
    return sched_rows, results, qdiscs, link_row, flow_rows


def _pingpong_rows(
    results: list[dict[str, Any]], sizes: list[int], tag: str
) -> dict[int, dict[str, float]]:
    """Per size, from the ping-pongs with ``tag`` (``shaped``, ``unshaped``): median
    one-way time (round trips / 2, pooled over pairs), CPU seconds per message and side
    (mean of both sides, pooled over pairs), the spread of one-way, and the median time a
    blocking send took to return."""
    out = {}
    for n in sizes:
        one_way: list[float] = []
        returns: list[float] = []
        cpu: list[float] = []
        machine: list[float] = []
        for res in results:
            for rec in res["pingpong"]:
                if rec["bytes"] != n or rec["tag"] != tag:
                    continue
                if rec["role"] == "ping":
                    one_way += [rt / 2 for rt in rec["round_trips_s"]]
                    returns += rec.get("send_returns_s", [])
                    if "machine_cpu_s" in rec:  # both sides and the kernel, per message
                        machine.append(rec["machine_cpu_s"] / rec["messages"] / 2)
                cpu.append(rec["cpu_s"] / rec["messages"])
        out[n] = {
            "one_way_s": _median(one_way),
            "spread_s": float(max(one_way) - min(one_way)),
            "sigma_s": _median_error(one_way),
            "cpu_s": float(np.mean(cpu)),
            "machine_cpu_s": float(np.mean(machine)) if machine else float("nan"),
            "send_return_s": _median(returns) if returns else float("nan"),
        }
    return out


def _allreduce_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (ranks, bytes): the per-repetition time is the slowest rank's; median and
    spread (max - min) over repetitions."""
    by_key: dict[tuple[int, int], list[list[float]]] = {}
    for res in results:
        for rec in res["allreduce"]:
            by_key.setdefault((rec["ranks"], rec["bytes"]), []).append(rec["times_s"])
    rows = []
    for (p, n), per_rank in sorted(by_key.items()):
        per_rep = np.max(np.asarray(per_rank, dtype=float), axis=0)
        rows.append(
            {
                "ranks": p,
                "bytes": n,
                "time_s": float(np.median(per_rep)),
                "spread_s": float(per_rep.max() - per_rep.min()),
            }
        )
    return rows


def _preset(
    *,
    cluster: str,
    rate: float | None,
    hosts: int,
    sizes: list[int],
    repeats: int,
    results: list[dict[str, Any]],
    qdiscs: list[dict[str, Any]],
    started: datetime.datetime,
    wall_s: float,
    scheduler_rows: Sequence[Mapping[str, Any]] = (),
    link_row: Mapping[str, Any] | None = None,
    flow_rows: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Fit the measurements and lay them out as a topology preset."""
    un = _pingpong_rows(results, sizes, "unshaped")
    sh = _pingpong_rows(results, sizes, "shaped") if rate is not None else un
    x = np.asarray(sizes, dtype=float)
    try:
        latency, goodput, net_fit = fit_shaped_link(
            x,
            [sh[n]["one_way_s"] for n in sizes],
            burst_payload_bytes(rate),
            [sh[n]["sigma_s"] for n in sizes],
        )
        message_cpu, copy_cpu, cpu_fit = fit_cpu_cost(x, [un[n]["cpu_s"] for n in sizes])
        process_copy_cpu = copy_cpu
        un_latency, un_goodput, wall_fit = fit_latency_bandwidth(
            x, [un[n]["one_way_s"] for n in sizes], 0.0, [un[n]["sigma_s"] for n in sizes]
        )
        # a shaped link costs more CPU per byte than the same link unshaped: tbf cuts the
        # kernel's 64 KiB segments into frames, each handled on its own in soft interrupts
        # that no process is charged for; the machine's busy time shows them
        # (busy time is counted in 10 ms ticks: only sizes that take many of them)
        big = [n for n in sizes if n >= SHAPED_CPU_MIN_BYTES]
        shaped_cpu = [sh[n]["machine_cpu_s"] for n in big]
        shaped_copy = None
        if rate is not None and len(big) >= 2 and all(c > 0 for c in shaped_cpu):
            shaped_copy = fit_cpu_cost(np.asarray(big, dtype=float), shaped_cpu)[1]
            if link_row is None:  # else the link benchmark measures that work (below)
                copy_cpu = max(copy_cpu, shaped_copy)
    except ValueError as err:
        raise CalibrationError(f"the measurements cannot be fitted: {err}") from None
    burst = burst_payload_bytes(rate)
    messenger = []
    for shaped_row, busy in ((False, False), (True, False), (True, True), (False, True)):
        for n in MESSENGER_SIZES_BYTES:
            recs = [
                rec
                for res in results
                for rec in res.get("messenger", [])
                if rec["role"] == "ping"
                and rec["bytes"] == 4 * _element_count(n)
                and rec.get("busy", False) == busy
                and rec.get("shaped", False) == shaped_row
            ]
            rts = [rt for rec in recs for rt in rec["round_trips_s"]]
            if rts:
                one_way = _median(rts) / 2
                wire = (
                    latency + max(0.0, n - burst) / goodput
                    if shaped_row or rate is None
                    else un_latency + n / un_goodput
                )
                row = {
                    "bytes": n,
                    "busy": busy,
                    "shaped": shaped_row,
                    "one_way_s": one_way,
                    "wire_s": wire,
                }
                cpus = [rec["cpu_s"] / rec["messages"] for rec in recs if rec.get("messages")]
                if cpus:
                    row["cpu_s"] = _median(cpus)
                if busy:  # what the messages cost beside a computing main thread
                    others = [
                        (rec["cpu_s"] - rec["main_cpu_s"]) / rec["messages"]
                        for rec in recs
                        if rec.get("messages") and "main_cpu_s" in rec
                    ]
                    if others:
                        row["messages_cpu_s"] = _median(others)
                messenger.append(row)
    # what a message through the runtime's messenger takes beyond the wire's time (the
    # blocking send's wait for the receiver's buffer, the threads' wake-ups), measured with
    # idle main threads; the same ping-pong while both main threads compute is kept as
    # evidence of what the model leaves out (docs/validation.md)
    on_link = [m for m in messenger if m["shaped"] == (rate is not None)]
    extra = [
        m["one_way_s"] - m["wire_s"]
        for m in on_link
        if not m["busy"] and m["bytes"] <= HANDSHAKE_MAX_BYTES
    ]
    handshake = max(0.0, _median(extra)) if extra else 0.0
    # the messenger threads' own CPU per message and end (idle ranks: rank 0's process
    # sends one message and receives one per round trip) on unshaped links, beyond a
    # plain send's or receive's there (process CPU both): over a shaped link the threads
    # also burn CPU while a message is in flight (8.9 ms for 1 MiB at 200 Mbit/s, 1.2 ms
    # at 1 Gbit/s), which does not carry over to a run's many messages at once
    p2p_message_cpu, p2p_copy_cpu = fit_messenger_cpu(
        [
            (m["bytes"], m["cpu_s"] - (message_cpu + m["bytes"] * process_copy_cpu))
            for m in messenger
            if not m["busy"] and not m["shaped"] and "cpu_s" in m
        ]
    )
    compute = next(r["compute"] for r in results if r.get("compute"))
    red_x = [c["bytes"] for c in compute["reduce"]]
    red_fit = fit_line(red_x, [c["cpu_s"] for c in compute["reduce"]])
    reduce_per_byte = red_fit.slope if red_fit.slope > 0 else _median(
        [c["cpu_s"] / c["bytes"] for c in compute["reduce"]]
    )  # fmt: skip
    mem_bw = compute["copy_bytes_per_s"]
    flops = compute["matmul_flops"]
    cpu = cpu_model()
    cores = _cores()
    torch_version = next(r["torch"] for r in results)
    rate_name = (
        f"{cluster}-{_rate_name(rate)}-calibrated"
        if rate is not None
        else ("local-calibrated" if cluster == "local" else "netns-unshaped-calibrated")
    )
    date = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    share = f" ({goodput / rate:.1%} of the {format_rate(rate)} tbf rate)" if rate else ""
    summary = (
        f"this machine's {'emulated cluster' if cluster == 'netns' else 'loopback'}, "
        f"calibrated {started:%Y-%m-%d}: {format_rate(goodput)} goodput{share}, "
        f"{latency * 1e6:.3g} us latency, {cores} shared cores ({cpu})"
    )
    p2p = [
        {
            "bytes": n,
            "shaped_s": sh[n]["one_way_s"] if rate is not None else None,
            "unshaped_s": un[n]["one_way_s"],
            "cpu_s": un[n]["cpu_s"],
            "shaped_machine_cpu_s": sh[n]["machine_cpu_s"] if rate is not None else None,
            "shaped_send_return_s": sh[n]["send_return_s"] if rate is not None else None,
        }
        for n in sizes
    ]
    send_buffer = send_buffer_bytes(
        [(n, sh[n]["send_return_s"]) for n in sizes] if rate is not None else [], goodput
    )
    fits = {
        "latency_s": latency,
        "goodput_bytes_per_s": goodput,
        "tbf_burst_payload_bytes": burst_payload_bytes(rate),
        "goodput_share_of_tbf_rate": goodput / rate if rate else None,
        "residual_rel_max": net_fit.residual_rel_max,
        "residual_rel_median": net_fit.residual_rel_median,
        "message_cpu_s": message_cpu,
        "copy_cpu_s_per_byte": copy_cpu,
        "shaped_copy_cpu_s_per_byte": shaped_copy,
        "cpu_residual_rel_max": cpu_fit.residual_rel_max,
        "cpu_residual_rel_median": cpu_fit.residual_rel_median,
        "unshaped_latency_s": wall_fit.intercept,
        "unshaped_goodput_bytes_per_s": un_goodput,
        "unshaped_residual_rel_max": wall_fit.residual_rel_max,
        "reduce_cpu_s_per_byte": reduce_per_byte,
        "reduce_residual_rel_max": red_fit.residual_rel_max,
        "p2p_handshake_s": handshake,
        "p2p_message_cpu_s": p2p_message_cpu,
        "p2p_copy_cpu_s_per_byte": p2p_copy_cpu,
        "socket_buffer_bytes": send_buffer,
    }
    measured: dict[str, Any] = {
        "date": date,
        "cpu": cpu,
        "cores": cores,
        "cluster": cluster,
        "tbf_rate": format_rate_text(rate) if rate is not None else None,
        "hosts": hosts,
        "torch": torch_version,
        "repeats": repeats,
        "wall_s": round(wall_s, 3),
        "p2p": p2p,
        "messenger": messenger,
        "allreduce": _allreduce_rows(results),
        "reduce": compute["reduce"],
        "copy_bytes_per_s": mem_bw,
        "matmul_flops": flops,
        "fits": fits,
    }
    if qdiscs:
        measured["tbf_drops"] = int(sum(q[e].get("drops", 0) for q in qdiscs for e in q))
    preset = {
        "name": rate_name,
        "summary": summary,
        "gpu": {
            "kind": "cpu",
            "model": cpu,
            "memory": memory_total_text(),
            "memory_bandwidth": format_rate_text(mem_bw),
            "peak_flops": float(f"{flops:.4g}"),
        },
        "host": {
            "cores": cores,
            "shared": True,
            "message_cpu_s": message_cpu,
            "copy_cpu_s_per_byte": copy_cpu,
            "reduce_cpu_s_per_byte": reduce_per_byte,
            "p2p_handshake_s": handshake,
            "p2p_message_cpu_s": p2p_message_cpu,
            "p2p_copy_cpu_s_per_byte": p2p_copy_cpu,
            "socket_buffer": f"{send_buffer}B",
        },
        "gloo": {"segment_bytes": GLOO_SEGMENT, "threads": GLOO_THREADS},
        "box": {
            "gpus": 1,
            "devices": {"cpu0": "cpu"},
            "links": [["gpu0", "cpu0", "pcie", "100GB/s", "0us"]],
            "host": "cpu0",
            "nic_attach": "cpu0",
        },
        "network": {
            "kind": "ethernet",
            "bandwidth": format_rate_text(goodput),
            # per link: a message between two hosts crosses two (host to switch, switch
            # to host), and the measured latency is the whole way's
            "latency": _time_text(latency / ROUTE_LINKS),
            # tbf's bucket: that much payload leaves at the unshaped speed after an idle spell
            **(
                {"burst": f"{round(burst)}B", "peak_bandwidth": format_rate_text(un_goodput)}
                if burst > 0
                else {}
            ),
            # the ranks' TCP connections take turns on a host's shaped link
            "sharing": "fair",
            "nic_link": {"kind": "pcie", "bandwidth": "100GB/s", "latency": "0us"},
        },
        "measured": measured,
    }
    # how long connections already sending keep a shaped link before a newcomer shares
    # it: the lead whose simulation of the two-flow benchmark matches it
    rows = sharing_rows(results) if rate is not None else []
    if rows:
        try:
            lead, residual = fit_sharing_lead(preset, SHARING_BYTES, rows)
        except ValueError as err:
            raise CalibrationError(f"the two-flow benchmark cannot be fitted: {err}") from None
        preset["network"]["lead"] = _time_text(lead)
        measured["sharing"] = [{"bytes": SHARING_BYTES, **r} for r in rows]
        fits["sharing_lead_s"] = lead
        fits["sharing_residual_rel_max"] = residual
    # how soon a core that ran out of threads takes over one queued on a busier core:
    # the delay whose simulation of the scheduler benchmark does as many cycles (before
    # the busy-cores fit, which simulates the cores with it)
    if scheduler_rows:
        try:
            balance, balance_residual = scheduler.fit_balance(scheduler_rows, cores)
        except ValueError as err:
            raise CalibrationError(f"the scheduler benchmark cannot be fitted: {err}") from None
        preset["host"]["balance_s"] = balance
        measured["scheduler"] = [dict(r) for r in scheduler_rows]
        fits["balance_s"] = balance
        fits["balance_residual_rel_max"] = balance_residual
    # how evenly flows share the links when every host sends at once
    if flow_rows and rate is not None:
        share, spread = flows.at(flow_rows, rate)
        preset["network"]["flow_share"] = round(share, 4)
        preset["network"]["flow_spread"] = round(spread, 4)
        measured["flows"] = [dict(r) for r in flow_rows]  # at each rate: moved by at_rate
        fits["flow_share"] = share
        fits["flow_spread"] = spread
    # the shaped link's packet work, measured as what computing processes lose to it
    if link_row is not None:
        link_cpu = linkcpu.link_cpu_s_per_byte(link_row)
        preset["host"]["link_cpu_s_per_byte"] = link_cpu
        measured["link_cpu"] = dict(link_row)
        fits["link_cpu_s_per_byte"] = link_cpu
        if "two_pairs" in link_row:  # the same with twice the links busy
            two = linkcpu.link_cpu_s_per_byte(link_row["two_pairs"])
            preset["host"]["link_cpu_two_pairs_s_per_byte"] = two
            measured["link_cpu"]["two_pairs"] = dict(link_row["two_pairs"])
            fits["link_cpu_two_pairs_s_per_byte"] = two
    # how long a woken thread waits for a core while the ranks compute on all of them:
    # the wait whose simulation of the busy-cores benchmark slows it down as measured
    wake_rows = wakeup_rows(results)
    if wake_rows:
        try:  # on the unshaped links it ran on
            wake, wake_residual = fit_wakeup(
                unshaped_links(preset, un_latency, un_goodput), wake_rows
            )
        except ValueError as err:
            raise CalibrationError(f"the busy-cores benchmark cannot be fitted: {err}") from None
        preset["host"]["wakeup_s"] = wake
        measured["wakeup"] = wake_rows
        fits["wakeup_s"] = wake
        fits["wakeup_residual_s_max"] = wake_residual
    measured["sources"] = knob_sources(preset)  # each setting's unit and source: KNOBS
    return preset


def write_calibration(preset: Mapping[str, Any], path: str) -> None:
    """Write ``preset`` as YAML to ``path`` atomically (all or nothing), sections in the
    order :func:`calibrate` made them, one line per measured row."""
    import yaml

    from traces.atomic import write_text

    class Dumper(yaml.SafeDumper):
        pass

    def flow_map(dumper: yaml.SafeDumper, data: _FlowMap) -> yaml.Node:
        return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)

    def flow_list(dumper: yaml.SafeDumper, data: _FlowList) -> yaml.Node:
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)

    Dumper.add_representer(_FlowMap, flow_map)
    Dumper.add_representer(_FlowList, flow_list)
    header = (
        "# Calibrated by `sim calibrate` on this machine; read by `sim run --topology FILE`.\n"
        "# See docs/emulated_cluster.md (Calibration) for what each value means.\n"
    )
    text = yaml.dump(
        _plain(preset), Dumper=Dumper, sort_keys=False, default_flow_style=False, width=200
    )
    write_text(path, header + text)


class _FlowMap(dict):  # type: ignore[type-arg]
    """A mapping written on one line (a row of measurements)."""


class _FlowList(list):  # type: ignore[type-arg]
    """A list written on one line (a link of the box)."""


def _plain(value: Any, inner: bool = False) -> Any:
    """Plain YAML-safe data: tuples to lists, numpy scalars to Python numbers, floats to
    five significant digits (more than any measurement here resolves); mappings and lists
    inside lists become one-line rows."""
    if isinstance(value, Mapping):
        items = {str(k): _plain(v) for k, v in value.items()}
        return _FlowMap(items) if inner else items
    if isinstance(value, list | tuple):
        items = [_plain(v, inner=True) for v in value]
        return _FlowList(items) if inner else items
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isfinite(value) and value != 0:
        return float(f"{value:.5g}")
    return value


def _two_pairs_text(fits: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    """The link CPU line's tail for two pairs busy at once (empty without them)."""
    if "link_cpu_two_pairs_s_per_byte" not in fits:
        return ""
    two = row["two_pairs"]
    return (
        f"; two pairs at once {fits['link_cpu_two_pairs_s_per_byte'] * 1e9:.3g} ns "
        f"({two['lost_cores']:.2f} cores lost, {two['ranks_cores']:.2f} the ranks')"
    )


def describe(preset: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The short human summary of a calibration, as (label, text) rows."""
    m = preset["measured"]
    fits = m["fits"]
    h = preset["host"]
    goodput = fits["goodput_bytes_per_s"]
    rows = []
    if m["tbf_rate"]:
        rows.append(
            (
                "goodput",
                f"{format_rate(goodput)}  ({fits['goodput_share_of_tbf_rate']:.1%} of the "
                f"{format_rate(parse_rate(m['tbf_rate']))} tbf rate)",
            )
        )
    else:
        rows.append(("goodput", f"{format_rate(goodput)}  (unshaped)"))
    rows += [
        (
            "latency",
            f"{fits['latency_s'] * 1e6:.3g} us  (one way; fit residual max "
            f"{fits['residual_rel_max']:.0%}, median {fits['residual_rel_median']:.0%})",
        ),
        (
            "CPU per message",
            f"{h['message_cpu_s'] * 1e6:.3g} us per side  (fit residual max "
            f"{fits['cpu_residual_rel_max']:.0%})",
        ),
        (
            "CPU per byte sent",
            f"{h['copy_cpu_s_per_byte'] * 1e9:.3g} ns per side  "
            f"(~{format_rate(1 / h['copy_cpu_s_per_byte']) if h['copy_cpu_s_per_byte'] else 'inf'} "
            "per core)",
        ),
        (
            "CPU per byte reduced",
            f"{h['reduce_cpu_s_per_byte'] * 1e9:.3g} ns  (float32 add_, one thread)",
        ),
        (
            "messenger handshake",
            f"{h.get('p2p_handshake_s', 0.0) * 1e6:.3g} us per point-to-point message "
            "beyond the wire's time, "
            f"{h.get('p2p_message_cpu_s', 0.0) * 1e6:.3g} us CPU per message and end "
            f"and {h.get('p2p_copy_cpu_s_per_byte', 0.0) * 1e9:.3g} ns per byte beyond a "
            "plain send's",
        ),
        *(
            [
                (
                    "link sharing",
                    f"a connection already sending keeps the link "
                    f"{fits['sharing_lead_s'] * 1e3:.3g} ms before a new one shares it "
                    f"(two-flow benchmark, residual max {fits['sharing_residual_rel_max']:.0%})",
                )
            ]
            if "sharing_lead_s" in fits
            else []
        ),
        *(
            [
                (
                    "link CPU",
                    f"{fits['link_cpu_s_per_byte'] * 1e9:.3g} ns per byte held to the rate, "
                    f"per side, taken from computing threads (link CPU benchmark: "
                    f"{m['link_cpu']['lost_cores']:.2f} cores lost, "
                    f"{m['link_cpu']['ranks_cores']:.2f} of them the ranks')"
                    + _two_pairs_text(fits, m["link_cpu"]),
                )
            ]
            if "link_cpu_s_per_byte" in fits
            else []
        ),
        *(
            [
                (
                    "concurrent flows",
                    f"with {m['flows'][0]['hosts']} hosts sending at once a flow gets "
                    f"{fits['flow_share']:.1%} of a lone flow's goodput on average, "
                    f"{fits['flow_spread']:.1%} apart (coefficient of variation); at "
                    + ", ".join(
                        f"{format_rate(e['rate_bytes_per_s'])} {e['share']:.1%} / {e['spread']:.1%}"
                        for e in m["flows"]
                    ),
                )
            ]
            if "flow_share" in fits
            else []
        ),
        *(
            [
                (
                    "scheduler",
                    f"a core left idle takes over a thread queued on a busier one after "
                    f"{fits['balance_s'] * 1e3:.3g} ms (scheduler benchmark, residual max "
                    f"{fits['balance_residual_rel_max']:.0%})",
                )
            ]
            if "balance_s" in fits
            else []
        ),
        *(
            [
                (
                    "wake-up",
                    f"a thread a message wakes waits {fits['wakeup_s'] * 1e3:.3g} ms per "
                    f"computing thread per core while compute takes every core (busy-cores "
                    f"benchmark, "
                    f"residual max {fits['wakeup_residual_s_max'] * 1e3:.2g} ms)",
                )
            ]
            if "wakeup_s" in fits
            else []
        ),
        (
            "send buffer",
            f"{format_bytes(parse_size(h.get('socket_buffer', 0)))} a blocking send hands "
            "the kernel before it returns",
        ),
        (
            "memory / compute",
            f"{preset['gpu']['memory_bandwidth']} copy, "
            f"{preset['gpu']['peak_flops'] / 1e9:.3g} GFLOP/s matmul (one thread)",
        ),
        (
            "unshaped",
            f"{format_rate(fits['unshaped_goodput_bytes_per_s'])}, "
            f"{fits['unshaped_latency_s'] * 1e6:.3g} us latency (wall-time fit)",
        ),
        (
            "all-reduce",
            f"{len(m['allreduce'])} points over ranks "
            f"{sorted({r['ranks'] for r in m['allreduce']})}, up to "
            f"{format_bytes(max((r['bytes'] for r in m['allreduce']), default=0))}",
        ),
        ("machine", f"{m['cores']} cores, {m['cpu']}; torch {m['torch']}; {m['wall_s']:.1f} s"),
    ]
    return rows


# ---------------------------------------------------------------------------------------
# One rank (python -m realrun.calibrate JOB.json)


def _rank_main(job_path: str) -> int:  # pragma: no cover - runs in the rank processes
    import resource

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    with open(job_path, encoding="utf-8") as fh:
        job = json.load(fh)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out_dir = job["out"]
    progress = open(os.path.join(out_dir, "progress"), "a") if rank == 0 else None  # noqa: SIM115

    def step(what: str) -> None:
        if progress is not None:
            progress.write(what + "\n")
            progress.flush()

    def cpu_now() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    sizes = [int(n) for n in job["sizes"]]
    repeats = int(job["repeats"])
    result: dict[str, Any] = {"rank": rank, "torch": torch.__version__, "pingpong": [],
                              "allreduce": []}  # fmt: skip
    dist.barrier()

    def pingpong(tag: str) -> None:
        for a, b in job["pairs"]:
            for n in sizes:
                if rank in (a, b):
                    result["pingpong"].append(_pingpong(dist, torch, rank, a, b, n, repeats,
                                                        cpu_now, tag))  # fmt: skip
                dist.barrier()
                step(f"ping-pong {format_bytes(n)} h{a}-h{b}")

    def allreduce() -> None:
        for p in job["allreduce_ranks"]:
            group = dist.new_group(list(range(p)))
            for n in sizes:
                if rank < p:
                    buf = torch.ones(_element_count(n), dtype=torch.float32)
                    dist.barrier(group)
                    dist.all_reduce(buf, group=group)  # warm-up
                    times = []
                    for _ in range(repeats):
                        dist.barrier(group)
                        t0 = time.perf_counter()
                        dist.all_reduce(buf, group=group)
                        times.append(time.perf_counter() - t0)
                    result["allreduce"].append(
                        {"ranks": p, "bytes": 4 * buf.numel(), "times_s": times}
                    )
                dist.barrier()
                step(f"all-reduce {format_bytes(n)} x{p}")

    for what in job["steps"]:
        kind, _, tag = what.partition(":")
        if kind == "pingpong":
            pingpong(tag)
        elif kind == "allreduce":
            allreduce()
        elif kind == "messenger":
            for n in MESSENGER_SIZES_BYTES:
                if rank in (0, 1):
                    row = _messenger_pingpong(
                        dist, torch, rank, world, n, repeats, tag == "busy", cpu_now
                    )
                    result.setdefault("messenger", []).append(
                        {
                            **row,
                            "busy": tag == "busy",
                            "shaped": tag != "unshaped" and "shape" in job["steps"],
                        }
                    )
                dist.barrier()
                step(f"messenger {format_bytes(n)} {tag or 'idle'}")
        elif kind == "sharing":
            if rank in (0, 1):
                result["sharing"] = _two_flows(
                    dist, torch, rank, SHARING_BYTES, job["sharing_delays_s"], repeats
                )
            dist.barrier()
            step("two flows")
        elif kind == "wakeup":
            pair = dist.new_group([0, 1])
            result["wakeup"] = _busy_allreduce(dist, torch, rank, world, pair, repeats)
            dist.barrier()
            step("all-reduce beside busy cores")
        elif kind == "compute":
            if rank == 0:
                result["compute"] = _compute_benchmarks(torch, step)
            dist.barrier()
        elif kind == "shape":
            # everybody idle while the parent shapes the links, then on together
            dist.barrier()
            step(SHAPE_LINE)
            shaped = os.path.join(out_dir, SHAPED_FILE)
            deadline = time.monotonic() + 60
            while not os.path.exists(shaped):
                if time.monotonic() > deadline:
                    raise RuntimeError("the links were not shaped within 60 s")
                time.sleep(0.01)
            dist.barrier()
        else:
            raise ValueError(f"unknown calibration step {what!r}")
    dist.destroy_process_group()
    tmp = os.path.join(out_dir, f"result{rank}.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, os.path.join(out_dir, f"result{rank}.json"))
    if progress is not None:
        progress.close()
    return 0


def _pingpong(
    dist: Any,
    torch: Any,
    rank: int,
    a: int,
    b: int,
    n: int,
    repeats: int,
    cpu_now: Callable[[], float],
    tag: str,
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """One size of the ping-pong between ranks ``a`` (sends first) and ``b``: one warm-up,
    then the timed round trips, how long each blocking send of ``a`` took to return (the
    receive is posted: what the kernel did not take into the socket's send buffer had to
    go out first) and the CPU seconds this process spent on them."""
    buf = torch.zeros(_element_count(n), dtype=torch.float32)
    peer = b if rank == a else a
    ping = rank == a

    def once() -> float:
        if ping:
            t0 = time.perf_counter()
            dist.send(buf, peer)
            returned = time.perf_counter() - t0
            dist.recv(buf, peer)
            return returned
        dist.recv(buf, peer)
        dist.send(buf, peer)
        return 0.0

    once()  # warm-up
    rts, returns = [], []
    reps = repeats * (SMALL_FACTOR if n <= SMALL_BYTES else 1)
    c0, m0 = cpu_now(), machine_busy_s()
    for _ in range(reps):
        t0 = time.perf_counter()
        returns.append(once())
        rts.append(time.perf_counter() - t0)
    cpu = cpu_now() - c0
    machine = machine_busy_s() - m0
    return {
        "machine_cpu_s": machine,
        "tag": tag,
        "pair": [a, b],
        "bytes": 4 * buf.numel(),
        "role": "ping" if ping else "pong",
        "round_trips_s": rts,
        "send_returns_s": returns,
        "cpu_s": cpu,
        "messages": 2 * reps,
    }


def _messenger_pingpong(
    dist: Any,
    torch: Any,
    rank: int,
    world: int,
    n: int,
    repeats: int,
    busy: bool = False,
    cpu_now: Callable[[], float] = time.process_time,
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """Ping-pong of ``n``-byte messages between ranks 0 and 1 through the runtime's own
    :class:`~realrun.runtime.Messenger` (the path of ``ps`` and ``p3``: a sender
    thread, header then payload, a receiver thread per peer, payload receives posted
    ahead): one warm-up, then ``4 * repeats`` timed round trips on rank 0, and the CPU
    seconds rank 0's process (all its threads) spent on them."""
    import threading

    from realrun.runtime import ACT, Messenger, Recorder

    numel = _element_count(n)
    buf = torch.zeros(numel)
    peer = 1 - rank
    reps = 4 * repeats + 1
    got = threading.Semaphore(0)
    seen = [0]
    done = threading.Event()

    def on_message(_src: int, _kind: int, key: int, it: int, _payload: Any, _at: float) -> None:
        if rank == 1:
            box[0].send(0, ACT, key, it, buf)
            seen[0] += 1
            if seen[0] == reps:
                done.set()
        else:
            got.release()

    box = [
        Messenger(
            rank, world, [peer], Recorder(f"r{rank}"), dist.group.WORLD, on_message,
            lambda _s, _k, _key: torch.empty(numel),
            expected=lambda _src: ((ACT, i, 0) for i in range(reps)), window=2,
        )
    ]  # fmt: skip
    box[0].start()
    rts: list[float] = []
    cpu = [0.0]
    # the main thread's own CPU clock, readable from the pinging thread: in the busy
    # ping-pong the process's CPU less the main thread's is what the messages cost
    main_clock = time.pthread_getcpuclockid(threading.main_thread().ident)
    main_cpu = [0.0]

    def ping() -> None:
        for i in range(reps):
            if i == 1:
                cpu[0] = -cpu_now()
                main_cpu[0] = -time.clock_gettime(main_clock)
            t0 = time.perf_counter()
            box[0].send(1, ACT, i, 0, buf)
            waited = 0
            while not got.acquire(timeout=1):
                box[0].check()  # a messaging thread's error, rather than a time-out
                waited += 1
                if waited == 60:
                    raise RuntimeError("the messenger ping-pong got no answer within 60 s")
            if i:
                rts.append(time.perf_counter() - t0)
        cpu[0] += cpu_now()
        main_cpu[0] += time.clock_gettime(main_clock)
        done.set()

    if busy:
        # the main thread trains meanwhile (small kernels with Python between them), as a
        # rank's does while its messenger threads carry the pipeline's messages
        if rank == 0:
            pinger = threading.Thread(target=ping)
            pinger.start()
        a = torch.rand(128, 128)
        while not done.is_set():
            for _ in range(20):
                a = torch.tanh(a @ a * 0.01)
        if rank == 0:
            pinger.join()
    elif rank == 0:
        ping()
    elif not done.wait(120):
        raise RuntimeError("the messenger ping-pong stopped before its last message")
    box[0].close()
    return {
        "bytes": 4 * numel,
        "role": "ping" if rank == 0 else "pong",
        "round_trips_s": rts,
        "cpu_s": cpu[0],
        "main_cpu_s": main_cpu[0],
        "messages": 2 * len(rts),
    }


def _two_flows(
    dist: Any, torch: Any, rank: int, nbytes: int, delays_s: Sequence[float], repeats: int
) -> dict[str, Any]:  # pragma: no cover - runs in the rank processes
    """The two-flow benchmark between ranks 0 and 1: rank 0 sends ``nbytes`` to rank 1 on
    each of two TCP connections per round, the second ``delay`` after the first, for each
    of ``delays_s`` ``repeats`` times after :data:`SHARING_WARMUP` rounds at the largest;
    rounds far enough apart that they never overlap. Rank 0 returns when each send
    started, rank 1 when each message's last byte came (``time.perf_counter``: one clock
    for every process of the machine)."""
    import socket
    import threading

    ser = max(delays_s) / max(SHARING_DELAYS)  # the first flow's time alone
    period = 2.5 * ser + 0.03
    # the delays take turns, so a stall of the machine spoils rounds of every delay, not
    # every repeat of one
    plan = [max(delays_s)] * SHARING_WARMUP + [d for _ in range(repeats) for d in delays_s]
    port = torch.zeros(1, dtype=torch.int64)
    listener = None
    if rank == 0:  # point to point: the other ranks are waiting at a barrier meanwhile
        listener = socket.create_server(("", 0))
        port[0] = listener.getsockname()[1]
        dist.send(port, 1)
    else:
        dist.recv(port, 0)
    conns: list[socket.socket] = []
    if rank == 1:
        for flow in range(2):
            c = socket.create_connection((os.environ["MASTER_ADDR"], int(port[0])))
            c.sendall(bytes([flow]))
            conns.append(c)
    else:
        assert listener is not None
        by_flow = {}
        for _ in range(2):
            c, _addr = listener.accept()
            by_flow[c.recv(1)[0]] = c
        listener.close()
        conns = [by_flow[0], by_flow[1]]
    for c in conns:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stamps: list[list[float]] = [[], []]
    errors: list[BaseException] = []
    t0 = time.perf_counter() + 0.05  # rank 1 is connected and receiving by now

    def sender(flow: int) -> None:
        data = bytes(nbytes)
        for k, d in enumerate(plan):
            at = t0 + k * period + (d if flow else 0.0)
            while (left := at - time.perf_counter()) > 0:
                time.sleep(left - 0.001 if left > 0.002 else 0)
            stamps[flow].append(time.perf_counter())
            conns[flow].sendall(data)

    def receiver(flow: int) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        for _ in plan:
            got = 0
            while got < nbytes:
                n = conns[flow].recv_into(view[: min(len(buf), nbytes - got)])
                if n == 0:
                    raise RuntimeError("the two-flow benchmark's connection closed early")
                got += n
            stamps[flow].append(time.perf_counter())

    def guarded(flow: int) -> None:
        try:
            (sender if rank == 0 else receiver)(flow)
        except BaseException as err:  # re-raised in the rank's main thread below
            errors.append(err)
            for c in conns:  # unblock the other flow's thread
                c.close()

    threads = [threading.Thread(target=guarded, args=(f,)) for f in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    if errors:
        raise RuntimeError(f"the two-flow benchmark failed: {errors[0]!r}") from errors[0]
    key = "start_s" if rank == 0 else "done_s"
    return {"delays_s": plan, "warmup": SHARING_WARMUP, "first_" + key: stamps[0],
            "second_" + key: stamps[1]}  # fmt: skip


def _busy_allreduce(
    dist: Any, torch: Any, rank: int, world: int, pair: Any, repeats: int
) -> list[dict[str, Any]]:  # pragma: no cover - runs in the rank processes
    """Ranks 0 and 1 all-reduce each of :data:`WAKEUP_SIZES_BYTES` (``pair``: a group of
    the two), one warm-up and ``WAKEUP_REPEATS * repeats`` timed, beside ``t`` computing
    threads for ``t`` = 0 (idle) and 2 to ``world``: ranks 0 and 1's main threads and
    those of ranks 2 .. ``t - 1`` train a small convolution meanwhile (a data-parallel
    step's backward beside its buckets' all-reduce; the other ranks' for a window of
    three idle all-reduces' time). Each all-reduce starts :data:`WAKEUP_PAUSE_S` after a barrier and
    is timed from its start to its end as a thread waiting on it sees it. Returns rank
    0's rows (``bytes``, ``threads``, ``times_s``); the other ranks' are empty."""
    import threading

    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    x = torch.rand(4, 16, 32, 32)
    rows = []
    window = torch.zeros(1, dtype=torch.float64)
    for n in WAKEUP_SIZES_BYTES:
        buf = torch.ones(_element_count(n))
        for threads in (0, *range(2, world + 1)):
            times = []
            for k in range(WAKEUP_REPEATS * repeats + 1):
                dist.barrier()
                time.sleep(WAKEUP_PAUSE_S)
                t0 = time.perf_counter()
                if rank < 2:
                    done: list[float] = []
                    work = dist.all_reduce(buf, group=pair, async_op=True)
                    waiter = threading.Thread(
                        target=lambda w=work, d=done: (w.wait(), d.append(time.perf_counter()))
                    )
                    waiter.start()
                    while threads and not done:
                        conv(x).sum().backward()
                    waiter.join()
                    if k:
                        times.append(done[0] - t0)
                elif rank < threads:
                    while time.perf_counter() - t0 < float(window[0]):
                        conv(x).sum().backward()
            if rank == 0:
                rows.append({"bytes": 4 * buf.numel(), "threads": threads, "times_s": times})
            if threads == 0:  # how long the other ranks compute beside this size
                if rank == 0:
                    window[0] = 3 * _median(times) + 0.02
                dist.broadcast(window, 0)
    return rows


def _compute_benchmarks(
    torch: Any, step: Callable[[str], None]
) -> dict[str, Any]:  # pragma: no cover
    """One-thread float32 reductions, copies and matmuls on this rank (the others wait)."""
    reduce_rows = []
    for n in REDUCE_SIZES_BYTES:
        a = torch.rand(n // 4)
        b = torch.rand(n // 4)
        reps = max(3, min(200, (64 * MiB) // n))
        a.add_(b)  # warm-up
        per_call = []
        for _ in range(5):
            c0 = time.thread_time()
            for _ in range(reps):
                a.add_(b)
            per_call.append((time.thread_time() - c0) / reps)
        reduce_rows.append({"bytes": n, "cpu_s": _median(per_call)})
    step("reduce")
    src = torch.rand(COPY_BYTES // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    step("copy")
    x = torch.rand(MATMUL_N, MATMUL_N)
    y = torch.rand(MATMUL_N, MATMUL_N)
    torch.mm(x, y)
    mms = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(x, y)
        mms.append(time.perf_counter() - t0)
    step("matmul")
    return {
        "reduce": reduce_rows,
        "copy_bytes_per_s": COPY_BYTES / min(copies),
        "matmul_flops": 2 * MATMUL_N**3 / min(mms),
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_rank_main(sys.argv[1]))
