"""The measured result of a real run, from the ranks' records (``records.json``), with the
same keys as ``sim run --json``. Pure functions; no torch.

* ``iteration_time_s``: the steady-state iteration time of :mod:`simcore.metrics`, over the
  workers' iteration ends (a worker's iteration ends when its backward is done and every
  value or gradient it waits for from that iteration has arrived).
* ``gpu_utilization``: per worker, the busy compute (forward, backward, update spans) of
  the measured iterations over their length; ``bubble_fraction`` is one minus the mean.
* ``comm_bytes_*``: application bytes counted by the sender (payload tensors; a control
  message counts its 64 bytes; an all-reduce counts the ring's ``2 (p-1)/p`` of the bucket
  per rank). ``comm_bytes_total``, ``comm_bytes_by_link`` and ``comm_bytes_by_link_kind``
  cover every iteration, warm-up included, as the simulator's link counters do;
  ``comm_bytes_per_iteration`` covers the measured ones. Message headers are counted apart
  (``header_bytes_per_iteration``). Bytes
  between hosts cross the sender's link to the switch and the switch's link to the
  receiver (``n<h>->switch``, ``switch->n<h>``, kind ``ethernet``); bytes between two ranks
  of one host stay on it (kind ``loopback``).
* ``single_gpu_time_s``: one rank doing the whole global batch, estimated from the measured
  compute: ``workers x (forward + backward) + update`` per iteration; ``speedup`` is that
  over ``iteration_time_s``.
* ``peak_memory_bytes``: the largest worker's peak resident memory (CPU) or peak CUDA
  allocation (GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simcore import metrics
from simcore.records import BACKWARD, COMPUTE, FORWARD, UPDATE

BUSY = (FORWARD, BACKWARD, UPDATE, "aggregate")


def summarize(
    records: Mapping[str, Any],
    *,
    wall_s: float = 0.0,
    cluster: str = "local",
    link_counters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result dictionary of a real run (see module docs)."""
    job = records["job"]
    ranks = sorted(records["ranks"], key=lambda r: r["rank"])
    workers = [r for r in ranks if r["role"] == "worker"]
    servers = [r for r in ranks if r["role"] == "server"]
    w = len(workers)
    warm, iters = int(job["warmup_iterations"]), int(job["iterations"])
    total_its = warm + iters
    first, last = warm, total_its - 1
    ends = [[float(r["iteration_end"].get(str(i), 0.0)) for r in workers] for i in range(total_its)]
    iter_s = metrics.steady_iteration_time(ends, warm)
    measured_s = iter_s * iters

    busy = []
    fb_s, upd_s = [], []
    for r in workers:
        b = fb = up = 0.0
        for s in r["spans"]:
            if s[1] == COMPUTE and s[2] in BUSY and first <= s[6] <= last:
                d = s[5] - s[4]
                b += d
                if s[2] in (FORWARD, BACKWARD):
                    fb += d
                else:
                    up += d
        busy.append(b)
        fb_s.append(fb / iters)
        upd_s.append(up / iters)
    server_update = sum(
        s[5] - s[4]
        for r in servers
        for s in r["spans"]
        if s[1] == COMPUTE and s[2] == UPDATE and first <= s[6] <= last
    )
    util = metrics.utilization(busy, measured_s)
    gpu_util = sum(util) / len(util) if util else 0.0
    update_per_it = (server_update / iters) if servers else (sum(upd_s) / max(1, w))
    single = w * (sum(fb_s) / max(1, w)) + update_per_it

    host_of = {r["rank"]: r["host"] for r in ranks}
    total = measured = 0
    by_rank = [0.0] * len(ranks)
    by_link: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    by_msg_kind: dict[str, float] = {}
    for r in ranks:
        src_host = r["host"]
        for dst, it, nbytes, kind in r["sent"]:
            total += nbytes
            dst_host = host_of[dst]
            if dst_host == src_host:
                by_kind["loopback"] = by_kind.get("loopback", 0) + nbytes
            else:
                for name in (f"n{src_host}->switch", f"switch->n{dst_host}"):
                    by_link[name] = by_link.get(name, 0) + nbytes
                by_kind["ethernet"] = by_kind.get("ethernet", 0) + 2 * nbytes
            if first <= it <= last:
                measured += nbytes
                by_rank[r["rank"]] += nbytes / iters
                by_msg_kind[kind] = by_msg_kind.get(kind, 0) + nbytes / iters
    headers = sum(r["header_bytes"] for r in ranks)
    peaks = [int(r["cuda_peak_bytes"] or r["peak_rss_bytes"]) for r in workers]
    batch = int(job["batch_size"])
    out: dict[str, Any] = {
        "scheme": job["scheme"],
        "gpus": w,
        "model": job["model"],
        "topology": f"real:{cluster}",
        "cluster": cluster,
        "backend": job["backend"],
        "device_type": workers[0]["device_type"] if workers else "cpu",
        "device_model": workers[0]["device_model"] if workers else "",
        "servers": len(servers),
        "batch_size": batch,
        "global_batch_size": batch * w,
        "iterations": iters,
        "warmup_iterations": warm,
        "iteration_time_s": iter_s,
        "iteration_times_s": metrics.iteration_durations(metrics.iteration_ends(ends)),
        "throughput_samples_s": batch * w / iter_s if iter_s > 0 else float("inf"),
        "single_gpu_time_s": single,
        "speedup": single / iter_s if iter_s > 0 else float("inf"),
        "gpu_utilization": gpu_util,
        "per_gpu_utilization": util,
        "bubble_fraction": max(0.0, 1.0 - gpu_util),
        "comm_bytes_total": total,
        "comm_bytes_per_iteration": measured / iters,
        "comm_bytes_per_iteration_by_rank": by_rank,
        "comm_bytes_per_iteration_by_message": by_msg_kind,
        "header_bytes_per_iteration": headers / total_its,
        "comm_bytes_by_link_kind": by_kind,
        "comm_bytes_by_link": by_link,
        "peak_memory_bytes": max(peaks) if peaks else 0,
        "per_gpu_peak_memory_bytes": peaks,
        "events": sum(len(r["spans"]) for r in ranks),
        "wall_s": wall_s,
        "device_names": [r["device"] for r in ranks],
        "torch": records.get("torch", ""),
    }
    for key in ("buckets_planned_bytes", "buckets_measured_bytes", "shuffle_label_bytes"):
        if workers and key in workers[0]:
            out[key] = workers[0][key]
    if workers and "placement" in workers[0]:
        out["placement"] = workers[0]["placement"]
    if link_counters:
        out.update(link_counters)
    return out


def spans(records: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Every rank's spans (Span field order), workers first."""
    ranks = sorted(records["ranks"], key=lambda r: r["rank"])
    return [tuple(s) for r in ranks for s in r["spans"]]
