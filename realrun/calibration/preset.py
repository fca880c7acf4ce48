"""The measurements of a calibration fitted and laid out as a topology preset
(:func:`make_preset`), and the YAML writer (:func:`write_calibration`).

The preset holds a CPU cluster's ``gpu`` (the ranks compute on the machine's cores),
``host``, ``gloo``, ``box`` and ``network`` sections as ``sim run --topology FILE`` reads
them, their keys as :mod:`simcore.preset_keys` declares them, and under ``measured``
everything the fits were made from, their residuals and each setting's source
(:data:`realrun.calibrated.KNOBS`).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from realrun import flows, linkcpu, scheduler
from realrun.calibrated import (
    burst_payload_bytes,
    format_rate_text,
    format_time_text,
    knob_sources,
)
from realrun.calibration import CalibrationError, KiB
from realrun.calibration.fits import (
    allreduce_rows,
    busy_messenger_cpu,
    fit_cpu_cost,
    fit_isend,
    fit_latency_bandwidth,
    fit_line,
    fit_messenger_cpu,
    fit_shaped_link,
    isend_rows,
    median,
    pingpong_rows,
    send_buffer_bytes,
    sharing_rows,
    wakeup_rows,
)
from realrun.calibration.ranks import MESSENGER_SIZES_BYTES, SHARING_BYTES, element_count
from realrun.calibration.simfits import ROUTE_LINKS, fit_sharing_lead, fit_wakeup, unshaped_links
from realrun.guard import machine_cores
from realrun.machine import cpu_model, memory_total_text
from simcore.preset_keys import canonical, written
from simcore.settings import ConfigError
from simcore.units import format_rate

__all__ = ["GLOO_SEGMENT", "GLOO_THREADS", "make_preset", "write_calibration"]

#: gloo's all-reduce segment (``kMaxSegmentSize`` in gloo/allreduce.h) and worker threads.
GLOO_SEGMENT = "1MiB"
GLOO_THREADS = 2
HANDSHAKE_MAX_BYTES = 64 * KiB
"""The messenger sizes the handshake is taken from: a larger message's time beyond the
wire's line is TCP's (its window after the idle half of a round trip), not the
handshake's."""
SHAPED_CPU_MIN_BYTES = 1 << 20
"""Smallest ping-pong size whose machine-wide CPU enters the shaped per-byte fit."""


def make_preset(
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
    un = pingpong_rows(results, sizes, "unshaped")
    sh = pingpong_rows(results, sizes, "shaped") if rate is not None else un
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
                and rec["bytes"] == 4 * element_count(n)
                and rec.get("busy", False) == busy
                and rec.get("shaped", False) == shaped_row
            ]
            rts = [rt for rec in recs for rt in rec["round_trips_s"]]
            if rts:
                one_way = median(rts) / 2
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
                    row["cpu_s"] = median(cpus)
                if busy:  # what the messages cost beside a computing main thread
                    others = [
                        (rec["cpu_s"] - rec["main_cpu_s"]) / rec["messages"]
                        for rec in recs
                        if rec.get("messages") and "main_cpu_s" in rec
                    ]
                    if others:
                        row["messages_cpu_s"] = median(others)
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
    handshake = max(0.0, median(extra)) if extra else 0.0
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
    # the same beside computing main threads: per message, what a run's messages cost
    # where the ranks compute (the fitted line's per-byte part is left out: over a shaped
    # link it holds the threads' burn while a message is in flight)
    p2p_busy_cpu = busy_messenger_cpu(messenger, message_cpu, process_copy_cpu)
    # a pipeline's isend on a computing rank's own thread, and its transport threads
    isend = isend_rows(results)
    isend_hold, posted_cpu = fit_isend(isend, message_cpu, process_copy_cpu)
    compute = next(r["compute"] for r in results if r.get("compute"))
    red_x = [c["bytes"] for c in compute["reduce"]]
    red_fit = fit_line(red_x, [c["cpu_s"] for c in compute["reduce"]])
    reduce_per_byte = red_fit.slope if red_fit.slope > 0 else median(
        [c["cpu_s"] / c["bytes"] for c in compute["reduce"]]
    )  # fmt: skip
    mem_bw = compute["copy_bytes_per_s"]
    flops = compute["matmul_flops"]
    cpu = cpu_model()
    cores = machine_cores()
    torch_version = next(r["torch"] for r in results)
    rate_name = (
        f"{cluster}-{format_rate(rate).replace(' ', '')}-calibrated"  # netns-1Gbps-calibrated
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
        "p2p_message_busy_cpu_s": p2p_busy_cpu,
        "isend_s": isend_hold,
        "posted_cpu_s": posted_cpu,
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
        "isend": isend,
        "allreduce": allreduce_rows(results),
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
            "memory_bytes": memory_total_text(),
            "memory_bandwidth_bytes_per_s": format_rate_text(mem_bw),
            "peak_flop_per_s": float(f"{flops:.4g}"),
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
            "p2p_message_busy_cpu_s": p2p_busy_cpu,
            "isend_s": isend_hold,
            "posted_cpu_s": posted_cpu,
            "socket_buffer_bytes": f"{send_buffer}B",
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
            "bandwidth_bytes_per_s": format_rate_text(goodput),
            # per link: a message between two hosts crosses two (host to switch, switch
            # to host), and the measured latency is the whole way's
            "latency_s": format_time_text(latency / ROUTE_LINKS),
            # tbf's bucket: that much payload leaves at the unshaped speed after an idle spell
            **(
                {
                    "burst_bytes": f"{round(burst)}B",
                    "peak_bandwidth_bytes_per_s": format_rate_text(un_goodput),
                }
                if burst > 0
                else {}
            ),
            # the ranks' TCP connections take turns on a host's shaped link
            "sharing": "fair",
            "nic_link": {"kind": "pcie", "bandwidth_bytes_per_s": "100GB/s", "latency_s": "0us"},
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
        preset["network"]["lead_s"] = format_time_text(lead)
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
    try:  # the machine sections as their declaration lays them out, every value checked
        return written(preset)
    except ConfigError as err:
        raise CalibrationError(f"the fitted preset is not one sim run reads: {err}") from None


def write_calibration(preset: Mapping[str, Any], path: str) -> None:
    """Write ``preset`` as YAML to ``path`` atomically (all or nothing): sections in the
    order :func:`make_preset` made them, the machine sections' keys named and ordered by
    their declaration (:func:`simcore.preset_keys.written`; older names renamed), one
    line per measured row. ``ConfigError`` for a key the simulator would not read."""
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
    data = _plain(written(canonical(preset)))
    text = yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=200)
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
