"""Helpers of the tests only: small topologies in the settings of the closed forms, and
the closed forms themselves."""

from __future__ import annotations

import math

from simcore.topology import GpuSpec, Topology, TopologyBuilder


def ring_topology(
    p: int, bandwidth: float, latency: float, kind: str = "nvlink", gpu: GpuSpec | None = None
) -> Topology:
    """``p`` GPUs in one box joined in a ring by direct links of equal bandwidth and
    latency (the setting of the ring all-reduce closed form)."""
    b = TopologyBuilder(f"ring{p}")
    for r in range(p):
        b.device(f"gpu{r}", "gpu", 0)
    host = b.device("cpu0", "cpu", 0)
    if p == 2:
        b.link(0, 1, kind, bandwidth, latency)
    elif p > 2:
        for r in range(p):
            b.link(r, (r + 1) % p, kind, bandwidth, latency)
    b.link(0, host, "pcie", bandwidth, latency)
    return b.build(list(range(p)), gpu_spec=gpu or GpuSpec(), hosts=[host])


def star_topology(
    hosts: int,
    bandwidth: float,
    latency: float,
    kind: str = "ethernet",
    servers: int = 0,
    gpu: GpuSpec | None = None,
) -> Topology:
    """``hosts`` one-GPU hosts and ``servers`` server hosts on one switch, each by a single
    link of equal bandwidth and latency (GPU and host CPU share the host's device)."""
    b = TopologyBuilder(f"star{hosts}")
    gpus = [b.device(f"gpu{h}", "gpu", h) for h in range(hosts)]
    sw = b.device("switch", "switch", -1)
    for g in gpus:
        b.link(g, sw, kind, bandwidth, latency)
    srv = []
    for s in range(servers):
        srv.append(b.device(f"ps{s}", "server", -1))
        b.link(srv[-1], sw, kind, bandwidth, latency)
    return b.build(gpus, gpu_spec=gpu or GpuSpec(), hosts=list(gpus), servers=srv)


def closed_form_ring_allreduce(p: int, n: float, alpha: float, bandwidth: float) -> float:
    """``2(p-1)·alpha + 2(p-1)/p · n/B``, seconds."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth


def closed_form_tree_allreduce(p: int, n: float, alpha: float, bandwidth: float) -> float:
    """``2·ceil(log2 p)·(alpha + n/B)``, seconds."""
    return 2 * math.ceil(math.log2(p)) * (alpha + n / bandwidth) if p > 1 else 0.0


def netns_unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here (``None`` when they can)."""
    from realrun.netns import NetnsUnavailable, check_available

    try:
        check_available()
    except NetnsUnavailable as err:
        return str(err)
    return None


def busy_cores_calibration(wakeup_s: float, latency_s: float = 60e-6) -> dict:
    """A calibrated preset (the ``netns`` preset with what :func:`realrun.calibration.run.calibrate`
    keeps of the busy-cores benchmark) whose rows the simulator made on the unshaped
    links ``latency_s`` and the preset's bandwidth describe, with a wake-up wait of
    ``wakeup_s``: fitting them gives that wait back."""
    import os

    import yaml

    from realrun.calibration.ranks import WAKEUP_SIZES_BYTES
    from realrun.calibration.simfits import simulate_busy_allreduce, unshaped_links
    from simcore.units import parse_rate

    path = os.path.join(
        os.path.dirname(__file__), "..", "simcore", "presets", "topologies", "netns.yaml"
    )
    with open(path, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    goodput = parse_rate(preset["network"]["bandwidth_bytes_per_s"])
    links = unshaped_links(preset, latency_s, goodput)
    rows = [
        {"bytes": n, "threads": t, "time_s": simulate_busy_allreduce(links, n, t, wakeup_s)}
        for n in WAKEUP_SIZES_BYTES
        for t in (0, 2, 3, 4)
    ]
    fits = {
        "unshaped_latency_s": latency_s,
        "unshaped_goodput_bytes_per_s": goodput,
        "wakeup_s": wakeup_s,
    }
    host = {**preset["host"], "wakeup_s": wakeup_s}
    return {**preset, "host": host, "measured": {"wakeup": rows, "fits": fits}}
