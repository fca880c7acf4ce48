"""Scoring: a case's row of the table, and the numbers over the rows.

:func:`case_row` compares the simulated result with the measured ones (``sim run
--json`` / ``sim real --json`` dictionaries): iteration time over the repeats and its
error, throughput, bytes on each host link on both sides (:func:`host_links`,
:func:`measured_links_real`, :func:`measured_links_sim`) and whether they are equal,
utilisation and bubble per rank, and ``why`` a case misses (:func:`why_missed`);
:func:`prediction_columns` adds the prediction's. :func:`summarise` and
:func:`summarise_prediction` give the median and largest errors over the rows.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.validation.matrix import Case

HIT = 0.05
"""A case whose |relative error| is within this is a hit; ``why`` explains the others."""

_SWITCH_LINK = re.compile(r"^(n\d+)(?:\.[^-]*)?->switch$|^switch->(n\d+)(?:\.\S*)?$")


def host_links(by_link: Mapping[str, Any]) -> dict[str, int]:
    """Bytes on each host's link to the switch, named as a real run names them
    (``n0->switch``, ``switch->n1``): the simulator's ``n0.nic0->switch`` becomes
    ``n0->switch``; links inside a host are left out; links that carried nothing too."""
    out: dict[str, int] = {}
    for name, v in by_link.items():
        m = _SWITCH_LINK.match(name)
        if not m or not v:
            continue
        key = f"{m.group(1)}->switch" if m.group(1) else f"switch->{m.group(2)}"
        out[key] = out.get(key, 0) + int(v)
    return dict(sorted(out.items()))


def _pair_links(pairs: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Bytes between hosts (``(src, dst) -> bytes``, ``n<h>`` names) as bytes on the hosts'
    links to the switch."""
    out: dict[str, int] = {}
    for (a, b), v in pairs.items():
        if a == b or not v:
            continue
        for key in (f"{a}->switch", f"switch->{b}"):
            out[key] = out.get(key, 0) + int(v)
    return dict(sorted(out.items()))


def measured_links_real(records: Mapping[str, Any]) -> dict[str, int]:
    """Bytes on each host link in the measured iterations of a real run (by the iteration
    the sender tagged each message with)."""
    job = records["job"]
    first = int(job["warmup_iterations"])
    last = first + int(job["iterations"]) - 1
    host = {r["rank"]: f"n{r['host']}" for r in records["ranks"]}
    pairs: dict[tuple[str, str], int] = {}
    for r in records["ranks"]:
        for dst, it, nbytes, _kind in r["sent"]:
            if first <= it <= last:
                key = (host[r["rank"]], host[dst])
                pairs[key] = pairs.get(key, 0) + int(nbytes)
    return _pair_links(pairs)


def measured_links_sim(result: Any) -> dict[str, int]:
    """Bytes on each host link in the measured iterations of a simulation, from its
    message spans (each send joined to its receive by the flow id)."""
    first = int(result.warmup_iterations)
    last = first + int(result.iterations) - 1
    receiver = {s[10]: s[0] for s in result.spans if s[1] == "recv"}
    pairs: dict[tuple[str, str], int] = {}
    for s in result.spans:
        if s[1] == "send" and first <= s[6] <= last and s[10] in receiver:
            key = (s[0].split(".")[0], receiver[s[10]].split(".")[0])
            pairs[key] = pairs.get(key, 0) + int(s[9])
    return _pair_links(pairs)


def without_shuffle_labels(real: Mapping[str, Any]) -> dict[str, Any]:
    """A gossip run with ``shuffle`` as the simulator counts it: without the labels that
    travel with each shuffled batch (the simulator moves the inputs only). Every worker
    sends one batch to its partner and receives one per iteration, warm-up included, so
    each host link carries the same label bytes per iteration: ``shuffle_label_bytes``
    (one worker's, over the measured iterations) over the measured iterations."""
    labels = real.get("shuffle_label_bytes") or 0
    if not labels:
        return dict(real)
    per_it = labels / int(real["iterations"])
    total_its = int(real["iterations"]) + int(real["warmup_iterations"])
    out = dict(real)
    out["comm_bytes_by_link"] = {
        k: v - round(per_it * total_its) if _SWITCH_LINK.match(k) else v
        for k, v in real["comm_bytes_by_link"].items()
    }
    out["comm_bytes_per_iteration"] = real["comm_bytes_per_iteration"] - per_it * real["gpus"]
    out["bytes_adjusted"] = "shuffled batches' labels left out"
    return out


def _busy_s(result: Mapping[str, Any]) -> float:
    """Mean compute seconds per measured iteration over the ranks (utilisation x time)."""
    util = list(result["per_gpu_utilization"]) or [0.0]
    return float(result["iteration_time_s"]) * sum(util) / len(util)


SEND_HOLD_SHARE = 0.2
"""A too-fast case's ``why`` names the real runs' send holds
(:func:`realrun.metrics.send_hold_s`) when they come to at least this share of the miss."""


def why_missed(
    rel_err: float,
    real_range_s: tuple[float, float],
    sim: Mapping[str, Any],
    real: Mapping[str, Any],
) -> str:
    """Why a case's simulated iteration time misses the measured one by more than
    :data:`HIT` (empty for a hit): inside the noise band of the real runs (the simulated
    time lies between the fastest and the slowest of them), or the term that differs
    most: compute (busy time per iteration) or the rest (communication and waiting),
    and, for a case predicted too fast, how long the real ranks' sends held them
    (``real["send_hold_s"]``) where that is a good part of the miss."""
    if abs(rel_err) <= HIT:
        return ""
    lo, hi = real_range_s
    t_sim = float(sim["iteration_time_s"])
    if lo <= t_sim <= hi:
        return (
            f"within the noise band: the real runs took {1e3 * lo:.1f} to {1e3 * hi:.1f} ms "
            f"(error {100 * rel_err:+.1f}%)"
        )
    t_sim, t_real = float(sim["iteration_time_s"]), float(real["iteration_time_s"])
    c_sim, c_real = _busy_s(sim), _busy_s(real)
    o_sim, o_real = t_sim - c_sim, t_real - c_real
    d_compute, d_other = c_sim - c_real, o_sim - o_real
    if abs(d_compute) >= abs(d_other):
        term, a, b, d = "compute", c_sim, c_real, d_compute
    else:
        term, a, b, d = "communication and waiting", o_sim, o_real, d_other
    why = (
        f"{term} per iteration differs most: simulated {1e3 * a:.1f} ms, measured "
        f"{1e3 * b:.1f} ms ({'+' if d >= 0 else ''}{1e3 * d:.1f} ms of the "
        f"{'+' if t_sim >= t_real else ''}{1e3 * (t_sim - t_real):.1f} ms)"
    )
    hold = float(real.get("send_hold_s", 0.0))
    if t_sim < t_real and hold >= SEND_HOLD_SHARE * (t_real - t_sim):
        why += (
            f"; a real rank's sends held its main thread {1e3 * hold:.1f} ms per iteration "
            "(simulated as every send's mean hold, host.isend_s)"
        )
    return why


def compact(values: Sequence[float]) -> str:
    """Numbers as a JSON list, rounded to four decimals (a row's per-rank columns)."""
    return json.dumps([round(float(v), 4) for v in values])


def case_row(
    case: Case, sim: Mapping[str, Any], reals: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One row of the table from the simulated result and the measured ones (``sim run
    --json`` / ``sim real --json`` dictionaries). The measured values are those of the
    median run (by iteration time); the spread is ``(max - min) / median``."""
    times = [float(r["iteration_time_s"]) for r in reals]
    med = statistics.median(times)
    median_run = min(reals, key=lambda r: abs(float(r["iteration_time_s"]) - med))
    t_sim = float(sim["iteration_time_s"])
    spread = (max(times) - min(times)) / med if med > 0 else math.inf
    rel = (t_sim - med) / med if med > 0 else math.inf
    if "measured_bytes_by_link" in sim:
        # the simulator ran lead or tail iterations the real run does not: compare the
        # measured iterations' bytes, link by link
        links_sim = dict(sim["measured_bytes_by_link"])
        links_real = [dict(r["measured_bytes_by_link"]) for r in reals]
    else:
        links_sim = host_links(sim["comm_bytes_by_link"])
        links_real = [host_links(r["comm_bytes_by_link"]) for r in reals]
    per_it_sim = float(sim["comm_bytes_per_iteration"])
    per_it_real = [float(r["comm_bytes_per_iteration"]) for r in reals]
    exact = all(lr == links_sim for lr in links_real) and all(p == per_it_sim for p in per_it_real)
    diff = max(
        (
            abs(lr.get(k, 0) - links_sim.get(k, 0))
            for lr in links_real
            for k in set(lr) | set(links_sim)
        ),
        default=0,
    )
    real_for_why = dict(median_run, iteration_time_s=med)
    return {
        "point_id": case.case_id,
        "status": "ok",
        "scheme": case.scheme,
        "model": case.model,
        "bandwidth": case.bandwidth,
        "bandwidth_bytes_per_s": case.bandwidth_bytes_per_s,
        "ranks": case.ranks,
        "batch_size": case.batch_size,
        "microbatches": case.microbatches,
        "iterations": case.iterations,
        "min_measured_s": case.min_measured_s,
        "run_iterations": case.measured_iterations,
        "warmup_iterations": case.warmup_iterations,
        "options": json.dumps(dict(case.options), sort_keys=True),
        "repeats": len(reals),
        "real_iteration_time_s": med,
        "real_iteration_time_min_s": min(times),
        "real_iteration_time_max_s": max(times),
        "real_iteration_times_s": compact(times),
        "real_spread": spread,
        "sim_iteration_time_s": t_sim,
        "rel_err": rel,
        "abs_rel_err": abs(rel),
        "real_throughput_samples_s": float(median_run["global_batch_size"]) / med,
        "sim_throughput_samples_s": float(sim["throughput_samples_s"]),
        "real_comm_bytes_per_iteration": per_it_real[0],
        "sim_comm_bytes_per_iteration": per_it_sim,
        "bytes_by_link_over": "measured" if "measured_bytes_by_link" in sim else "run",
        "bytes_adjusted": str(median_run.get("bytes_adjusted", "")),
        "real_bytes_by_link": json.dumps(links_real[0]),
        "sim_bytes_by_link": json.dumps(links_sim),
        "bytes_exact": exact,
        "bytes_max_link_diff": int(diff),
        "real_utilization": compact(median_run["per_gpu_utilization"]),
        "sim_utilization": compact(sim["per_gpu_utilization"]),
        "real_bubble": float(median_run["bubble_fraction"]),
        "sim_bubble": float(sim["bubble_fraction"]),
        "real_bubble_per_rank": compact([1 - u for u in median_run["per_gpu_utilization"]]),
        "sim_bubble_per_rank": compact([1 - u for u in sim["per_gpu_utilization"]]),
        "real_send_hold_s": float(median_run.get("send_hold_s", 0.0)),
        "real_compute_s": _busy_s(real_for_why),
        "sim_compute_s": _busy_s(sim),
        "why": why_missed(rel, (min(times), max(times)), sim, real_for_why),
        "error": "",
    }


def prediction_columns(predicted_s: float, measured_s: float) -> dict[str, float]:
    """A row's prediction columns: the predicted time and its relative error against the
    measured median (the replay's are ``sim_iteration_time_s`` and ``rel_err``)."""
    rel = (predicted_s - measured_s) / measured_s if measured_s > 0 else math.inf
    return {
        "predicted_iteration_time_s": float(predicted_s),
        "prediction_rel_err": rel,
        "abs_prediction_rel_err": abs(rel),
    }


def speed_columns(
    profile_probe_s: float | None, probes_s: Sequence[float | None]
) -> dict[str, float]:
    """A row's machine-speed columns: the compute probe taken with the profile, the mean
    of those taken right before and after the case's runs, and their ratio
    (``machine_vs_profile``: above 1, the machine computed slower at the case than when
    the model was profiled). ``nan`` where a probe is missing."""
    taken = [float(p) for p in probes_s if p is not None]
    now = statistics.fmean(taken) if taken else math.nan
    then = math.nan if profile_probe_s is None else float(profile_probe_s)
    ratio = now / then if then > 0 and not math.isnan(now) else math.nan
    return {"profile_probe_s": then, "machine_probe_s": now, "machine_vs_profile": ratio}


def summarise(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
    """``(median |rel err|, max |rel err|, bytes-exact count)`` over the ``ok`` rows
    (``nan`` errors when there are none)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    errs = [abs(float(r["rel_err"])) for r in ok]
    if not errs:
        return math.nan, math.nan, 0
    return statistics.median(errs), max(errs), sum(bool(r["bytes_exact"]) for r in ok)


def summarise_prediction(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """``(median, max)`` of |prediction error| over the ``ok`` rows that have one
    (``nan`` when none has)."""
    errs = [
        abs(float(r["prediction_rel_err"]))
        for r in rows
        if r.get("status") == "ok" and is_number(r.get("prediction_rel_err"))
    ]
    if not errs:
        return math.nan, math.nan
    return statistics.median(errs), max(errs)


def is_number(v: Any) -> bool:
    """Whether ``v`` reads as a number that is not ``nan``."""
    try:
        return not math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def predicted_s(row: Mapping[str, Any]) -> float:
    """A row's prediction (rows from before the prediction columns: the profile's)."""
    v = row.get("predicted_iteration_time_s")
    return float(v) if is_number(v) else float(row.get("sim_profiled_iteration_time_s", math.nan))


def prediction_err(row: Mapping[str, Any]) -> float:
    v = row.get("prediction_rel_err")
    if is_number(v):
        return float(v)
    measured = float(row["real_iteration_time_s"])
    return (predicted_s(row) - measured) / measured
