"""Fits by simulation: the value of a setting whose simulated benchmark matches the
measured one.

How long connections already sending keep a shaped link before a newcomer shares it
(``network.lead_s``: :func:`fit_sharing_lead`, simulating the two-flow benchmark with
:func:`simulate_two_flows`), and how long a woken thread waits for a core while the
ranks compute on all of them (``host.wakeup_s``: :func:`fit_wakeup`, simulating the
busy-cores benchmark with :func:`simulate_busy_allreduce` on the unshaped links it ran on,
:func:`unshaped_links`; :func:`pool_wakeup` fits one wait over several calibrations).
Each simulation runs the simulator's own network and host models on a two-host cluster
of the calibrated preset.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from realrun.calibrated import format_rate_text, format_time_text
from realrun.calibration.fits import segment_bytes
from simcore.preset_keys import canonical

__all__ = [
    "ROUTE_LINKS",
    "SHARING_LEADS_S",
    "WAKEUP_GRID_S",
    "fit_sharing_lead",
    "fit_wakeup",
    "fit_wakeup_pooled",
    "pool_wakeup",
    "simulate_busy_allreduce",
    "simulate_two_flows",
    "unshaped_links",
]

SHARING_LEADS_S = tuple(i * 0.25e-3 for i in range(161))
"""The leads (:attr:`simcore.topology.Topology.link_lead_s`) tried when fitting the
two-flow benchmark: 0 to 40 ms."""
WAKEUP_GRID_S = tuple(round(i * 0.05e-3, 9) for i in range(101))
"""The wake-up waits (:attr:`simcore.topology.HostSpec.wakeup_s`) tried when fitting the
busy-cores benchmark: 0 to 5 ms."""
ROUTE_LINKS = 2
"""Network links between two hosts of the emulated cluster (host to switch, switch to
host): the preset's per-link latency is the measured one-way latency over this."""


def simulate_two_flows(
    preset: Mapping[str, Any], nbytes: int, delay_s: float, lead_s: float
) -> tuple[float, float]:
    """The two-flow benchmark simulated on a two-host cluster of ``preset`` whose links
    let flows already sending go on ``lead_s`` (``network.lead_s``) before a newcomer's
    turn: when the first flow's message (host 0's rank to host 1's) and the second's (the
    hosts' other devices, started ``delay_s`` later) have arrived."""
    from simpy import Environment

    from simcore.network import DetailedNetwork
    from simcore.topology import TopologySpec, build_topology

    preset = canonical(preset)
    net_section = {**preset["network"], "sharing": "fair", "lead_s": lead_s}
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
    bucket, no lead. The busy-cores benchmark runs on such links. Its keys are named by
    their fields (:func:`simcore.preset_keys.canonical`)."""
    preset = canonical(preset)
    shaping = ("burst_bytes", "peak_bandwidth_bytes_per_s", "lead_s")
    network = {k: v for k, v in preset["network"].items() if k not in shaping}
    network["bandwidth_bytes_per_s"] = format_rate_text(goodput_bytes_per_s)
    network["latency_s"] = format_time_text(max(latency_s, 0.0) / ROUTE_LINKS)
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
