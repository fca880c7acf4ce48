"""The calibration's fits (pure numpy) and the rows of rank results they are fitted to.

Straight lines with non-negative coefficients, robust against a point another process on
the machine disturbed (:func:`fit_line`); a link's latency and goodput from one-way
message times (:func:`fit_latency_bandwidth`, :func:`fit_shaped_link`); CPU costs per
message and per byte (:func:`fit_cpu_cost`, :func:`fit_messenger_cpu`); the socket's
send buffer (:func:`send_buffer_bytes`); the simulated network's chunk for a calibrated
link (:func:`segment_bytes`); and the medians per size of the ranks' raw results
(:func:`pingpong_rows`, :func:`allreduce_rows`, :func:`sharing_rows`,
:func:`wakeup_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from realrun.calibration import KiB, MiB
from realrun.machine import tcp_send_buffer_bytes

__all__ = [
    "FRAME_CHUNK_BYTES",
    "SEGMENT_BYTES",
    "LineFit",
    "allreduce_rows",
    "busy_messenger_cpu",
    "fit_cpu_cost",
    "fit_isend",
    "fit_latency_bandwidth",
    "fit_line",
    "fit_messenger_cpu",
    "fit_shaped_link",
    "isend_rows",
    "median",
    "pingpong_rows",
    "segment_bytes",
    "send_buffer_bytes",
    "sharing_rows",
    "wakeup_rows",
]

SEGMENT_BYTES = 64 * KiB
"""A TCP segment as the kernel hands it on (64 KiB with segmentation offload): the chunk
of the simulated network for a calibrated link whose tbf passes such segments whole
(:func:`segment_bytes`)."""
FRAME_CHUNK_BYTES = 16 * KiB
"""The chunk of the simulated network for a calibrated link whose tbf cuts segments into
frames (:func:`segment_bytes`)."""


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
        return max(0.0, median(ys)), 0.0
    fit = fit_line(xs, ys, relative=False)
    return fit.intercept, fit.slope


def busy_messenger_cpu(
    messenger: Sequence[Mapping[str, Any]], message_cpu_s: float, copy_cpu_s_per_byte: float
) -> float:
    """``p2p_message_busy_cpu_s``: the per-message part of :func:`fit_messenger_cpu`'s
    line through the messenger ping-pong rows measured beside computing main threads
    (``busy``; their ``messages_cpu_s``, the process's CPU less the main thread's, per
    message) beyond a plain send's ``message_cpu_s`` and copies; 0 without such rows
    (the idle cost stands for every load)."""
    points = [
        (m["bytes"], m["messages_cpu_s"] - (message_cpu_s + m["bytes"] * copy_cpu_s_per_byte))
        for m in messenger
        if m.get("busy") and "messages_cpu_s" in m
    ]
    return fit_messenger_cpu(points)[0] if points else 0.0


def isend_rows(results: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per size of the pipeline-message benchmark, the medians over its two ranks:
    ``{bytes, shaped, isend_cpu_s, off_main_cpu_s}`` (see
    :func:`realrun.calibration.ranks._isend_beside_compute`)."""
    by_size: dict[int, list[Mapping[str, Any]]] = {}
    for res in results:
        for rec in res.get("isend", []):
            by_size.setdefault(int(rec["bytes"]), []).append(rec)
    return [
        {
            "bytes": n,
            "shaped": bool(recs[0].get("shaped", False)),
            "isend_cpu_s": median([float(r["isend_cpu_s"]) for r in recs]),
            "off_main_cpu_s": median([float(r["off_main_cpu_s"]) for r in recs]),
        }
        for n, recs in sorted(by_size.items())
    ]


def fit_isend(
    rows: Sequence[Mapping[str, Any]], message_cpu_s: float, copy_cpu_s_per_byte: float
) -> tuple[float, float]:
    """``(isend_s, posted_cpu_s)`` from :func:`isend_rows`: the per-message parts of
    :func:`fit_messenger_cpu`'s lines through, over the sizes, the main thread's CPU in an
    ``isend`` beyond the message's sending end (``message_cpu_s`` and the copies, what
    ``HostSpec.message_cpu`` charges it), and the other threads' CPU per message end
    beyond half a message's (the receiving end's, charged off the rank's thread; one end
    in two is a receive). Their per-byte parts are left out: over a shaped link they
    hold the link's packet work, which ``link_cpu_s_per_byte`` charges. ``(0, 0)``
    without rows."""
    if not rows:
        return 0.0, 0.0
    hold = [
        (r["bytes"], r["isend_cpu_s"] - (message_cpu_s + r["bytes"] * copy_cpu_s_per_byte))
        for r in rows
    ]
    posted = [
        (r["bytes"], r["off_main_cpu_s"] - (message_cpu_s + r["bytes"] * copy_cpu_s_per_byte) / 2)
        for r in rows
    ]
    return fit_messenger_cpu(hold)[0], fit_messenger_cpu(posted)[0]


def fit_cpu_cost(
    sizes_bytes: Sequence[float], cpu_s: Sequence[float]
) -> tuple[float, float, LineFit]:
    """``(message_cpu_s, copy_cpu_s_per_byte, fit)``: CPU seconds per message and side,
    fitted robustly as ``message_cpu_s + n * copy_cpu_s_per_byte``."""
    fit = fit_line(sizes_bytes, cpu_s)
    return fit.intercept, fit.slope, fit


def segment_bytes(preset: Mapping[str, Any]) -> int:
    """The chunk of the simulated network for a calibrated link (``preset``'s
    ``network.burst_bytes``; here and in ``sim validate``). The kernel hands tbf 64 KiB segments
    (:data:`SEGMENT_BYTES`); tbf passes a segment whole when its bucket holds one and
    otherwise cuts it into frames, which the receiver's shaped hop then forwards frame by
    frame: 16 KiB chunks then (:data:`FRAME_CHUNK_BYTES`), which store-and-forward at
    that second hop about as frames would, at a tenth of their events
    (docs/emulated_cluster.md). A link without a bucket (unshaped) carries whole
    segments."""
    from simcore.topology import parse_sections

    burst = parse_sections(preset).network.burst_bytes
    return FRAME_CHUNK_BYTES if 0 < burst < SEGMENT_BYTES else SEGMENT_BYTES


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
    return round(median(est)) if est else tcp_send_buffer_bytes()


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
                "delay_s": median([sent["second_start_s"][k] - a for k, a in zip(ks, a0)]),
                "first_s": median([got["first_done_s"][k] - a for k, a in zip(ks, a0)]),
                "second_s": median([got["second_done_s"][k] - a for k, a in zip(ks, a0)]),
            }
        )
    return rows


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
                "time_s": median(row["times_s"]),
            }
            for row in got
            if row["times_s"]
        ),
        key=lambda r: (r["bytes"], r["threads"]),
    )


def pingpong_rows(
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
            "one_way_s": median(one_way),
            "spread_s": float(max(one_way) - min(one_way)),
            "sigma_s": _median_error(one_way),
            "cpu_s": float(np.mean(cpu)),
            "machine_cpu_s": float(np.mean(machine)) if machine else float("nan"),
            "send_return_s": median(returns) if returns else float("nan"),
        }
    return out


def allreduce_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def _median_error(samples: Sequence[float], floor_rel: float = 0.005) -> float:
    """The standard error of the median of ``samples``: 1.253 times the robust standard
    deviation (1.4826 MAD) over the square root of their count, at least ``floor_rel`` of
    the median (the timer and a handful of samples resolve no better)."""
    arr = np.asarray(samples, dtype=float)
    med = float(np.median(arr))
    sd = 1.4826 * float(np.median(np.abs(arr - med)))
    return max(1.253 * sd / math.sqrt(len(arr)), floor_rel * abs(med), 1e-9)


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float)))
