"""A calibrated topology file as a prediction input: its link rate, and the same
calibration moved to another rate.

``sim calibrate`` measures an emulated cluster whose links ``tc tbf`` shapes to one rate,
and writes what it measured as a topology preset (:func:`realrun.calibration.run.calibrate`):
``network.bandwidth`` is the TCP goodput the links carried, a share of the tbf rate
(``measured.fits.goodput_share_of_tbf_rate``, about 1448/1514 less tbf's losses), and
``network.burst`` the payload of tbf's bucket at that rate. A what-if at another link rate
(``sim run --topology calibrated.yaml --bandwidth R``, or ``sim validate`` predicting a
case at a rate it did not calibrate) keeps everything measured of the hosts and the
protocol and moves only what the rate sets (:func:`at_rate`):

* the goodput: the new rate times the measured share;
* the bucket: the one ``sim real`` shapes at the new rate
  (:func:`burst_payload_bytes`);
* concurrent flows' share and spread (``network.flow_share``, ``flow_spread``): read at
  the new rate from those measured at several rates (:func:`realrun.flows.at`);
* ``measured.tbf_rate`` becomes the new rate, and ``measured.moved_from`` records the rate
  the calibration was measured at.

The link latency, the unshaped peak rate, the sharing lead, and every host cost (per
message, per byte, the links' packet work per byte, wake-up waits) are kept: they are
properties of the hosts and the veth pairs, which the rate does not change. Whether that
holds is what ``sim validate --calibrate-at`` measures. No torch; no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOBS",
    "Knob",
    "at_rate",
    "burst_payload_bytes",
    "calibrated_rate",
    "format_rate_text",
    "format_time_text",
    "goodput_share",
    "is_calibrated",
    "knob_sources",
]


@dataclass(frozen=True)
class Knob:
    """One setting of a calibrated topology file that the simulator reads.

    Attributes:
        path: its place in the file, ``section.key``.
        unit: what its number means.
        source: where its value comes from: ``calibration:<benchmark>`` (measured by that
            microbenchmark of ``sim calibrate``), ``fit-by-simulation:<benchmark>`` (the
            value whose simulation of that benchmark matches the measurement),
            ``profile`` (measured with the model's profile, beside the trace),
            ``constant`` (a property of the software, not measured), or ``run`` (taken
            from a real run of the case itself: the replay's alone, never a
            prediction's).
        what: one line on what it stands for.
    """

    path: str
    unit: str
    source: str
    what: str


KNOBS: tuple[Knob, ...] = (
    Knob("gpu.memory", "bytes", "constant", "the machine's memory (/proc/meminfo)"),
    Knob("gpu.memory_bandwidth", "bytes/s", "calibration:copy", "one thread's copy rate"),
    Knob("gpu.peak_flops", "FLOP/s", "calibration:matmul", "one thread's float32 matmul rate"),
    Knob("gpu.step_overhead", "s", "profile", "an optimizer step's fixed cost"),
    Knob("gpu.predict_overhead", "s", "run", "SpecTrain's fixed cost of a weight prediction"),
    Knob("host.cores", "cores", "constant", "the machine's cores the ranks share"),
    Knob("host.shared", "flag", "constant", "every emulated host on the same cores"),
    Knob("host.message_cpu_s", "s", "calibration:unshaped ping-pong", "CPU per message"),
    Knob(
        "host.copy_cpu_s_per_byte", "s/byte", "calibration:unshaped ping-pong",
        "CPU per byte sent or received",
    ),
    Knob(
        "host.reduce_cpu_s_per_byte", "s/byte", "calibration:reduce",
        "CPU per byte summed by a collective",
    ),
    Knob(
        "host.p2p_handshake_s", "s", "calibration:messenger ping-pong",
        "a point-to-point message's handshake",
    ),
    Knob(
        "host.p2p_message_cpu_s", "s", "calibration:messenger ping-pong",
        "the messenger threads' CPU per message (the replay takes it from the run)",
    ),
    Knob(
        "host.p2p_copy_cpu_s_per_byte", "s/byte", "calibration:messenger ping-pong",
        "the messenger threads' CPU per byte",
    ),
    Knob(
        "host.socket_buffer", "bytes", "calibration:shaped ping-pong",
        "what a blocking send hands the kernel before it returns",
    ),
    Knob("host.isend_s", "s", "run", "the sending thread's hold per isend"),
    Knob("host.posted_cpu_s", "s", "run", "a pipeline's transport threads' CPU per message end"),
    Knob(
        "host.wakeup_s", "s", "fit-by-simulation:busy cores",
        "a woken thread's wait for a core while every core computes",
    ),
    Knob(
        "host.balance_s", "s", "fit-by-simulation:scheduler",
        "how soon an idle core takes over a thread queued on a busier one",
    ),
    Knob(
        "host.link_cpu_s_per_byte", "s/byte", "calibration:link cpu",
        "a shaped link's packet work per byte and end, one pair busy",
    ),
    Knob(
        "host.link_cpu_two_pairs_s_per_byte", "s/byte", "calibration:link cpu",
        "the same with two pairs busy",
    ),
    Knob("gloo.segment_bytes", "bytes", "constant", "gloo's all-reduce segment (1 MiB)"),
    Knob("gloo.threads", "threads", "constant", "ProcessGroupGloo's worker threads (2)"),
    Knob("network.bandwidth", "bytes/s", "calibration:shaped ping-pong", "the links' goodput"),
    Knob("network.latency", "s", "calibration:shaped ping-pong", "one link's latency"),
    Knob("network.burst", "bytes", "constant", "tbf's bucket as sim real shapes it"),
    Knob(
        "network.peak_bandwidth", "bytes/s", "calibration:unshaped ping-pong",
        "the rate a full bucket's bytes leave at",
    ),
    Knob("network.sharing", "policy", "constant", "TCP connections take turns on a link"),
    Knob(
        "network.lead", "s", "fit-by-simulation:two flows",
        "how long a sending connection keeps a link before a newcomer shares it",
    ),
    Knob(
        "network.flow_share", "share", "calibration:concurrent flows",
        "a flow's mean goodput while every host sends, over a lone flow's",
    ),
    Knob(
        "network.flow_spread", "CV", "calibration:concurrent flows",
        "how far apart concurrent flows' goodputs are (coefficient of variation)",
    ),
)  # fmt: skip
"""Every setting of a calibrated file, declared once: unit and source."""


def knob_sources(preset: Mapping[str, Any]) -> dict[str, str]:
    """``{path: source}`` of the declared knobs ``preset`` sets (:data:`KNOBS`)."""
    out = {}
    for knob in KNOBS:
        section, key = knob.path.split(".")
        values = preset.get(section)
        if isinstance(values, Mapping) and key in values:
            out[knob.path] = knob.source
    return out


def _measured(preset: Mapping[str, Any]) -> Mapping[str, Any]:
    m = preset.get("measured")
    return m if isinstance(m, Mapping) else {}


TCP_PAYLOAD_BYTES = 1448
"""TCP payload of a full 1514-byte frame (1500-byte MTU, TCP timestamps on)."""


def burst_payload_bytes(rate_bytes_per_s: float | None) -> float:
    """Payload bytes that fit in the tbf bucket of a link shaped to ``rate_bytes_per_s``
    (``sim real``'s shaping, :func:`realrun.netns.shape_for_rate`; full-size TCP segments:
    1448 payload bytes per 1514-byte frame); 0 for an unshaped link."""
    if rate_bytes_per_s is None:
        return 0.0
    from realrun.netns import FRAME_BYTES, shape_for_rate

    return shape_for_rate(rate_bytes_per_s).burst_bytes * TCP_PAYLOAD_BYTES / FRAME_BYTES


def format_rate_text(bytes_per_s: float) -> str:
    """A rate as ``parse_rate`` reads it, four significant digits: ``119.6MB/s``."""
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g}{prefix}B/s"
    return f"{bytes_per_s:.4g}B/s"


def format_time_text(seconds: float) -> str:
    """A duration as ``parse_time`` reads it: ``52.3us``."""
    return f"{seconds * 1e6:.4g}us"


def is_calibrated(preset: Mapping[str, Any]) -> bool:
    """Whether ``preset`` was written by ``sim calibrate`` (it has the fitted goodput)."""
    fits = _measured(preset).get("fits")
    return isinstance(fits, Mapping) and "goodput_bytes_per_s" in fits


def calibrated_rate(preset: Mapping[str, Any]) -> float | None:
    """The tbf rate (bytes/s) a calibrated ``preset``'s links were shaped to; ``None`` for
    a calibration on unshaped links (loopback) or a preset that is not calibrated."""
    from simcore.units import parse_rate

    rate = _measured(preset).get("tbf_rate")
    return parse_rate(rate) if rate else None


def goodput_share(preset: Mapping[str, Any]) -> tuple[float, str]:
    """``(share, source)``: the fraction of a link's tbf rate that TCP payload gets on the
    cluster ``preset`` calibrates. Measured where the calibration shaped its links
    (``calibration:shaped ping-pong``); else the payload share of full-size frames
    (``constant``: 1448 of every 1514 bytes), which is what an unloaded shaped link
    carries at best."""
    fits = _measured(preset).get("fits")
    share = fits.get("goodput_share_of_tbf_rate") if isinstance(fits, Mapping) else None
    if share:
        return float(share), "calibration:shaped ping-pong"
    from realrun.netns import FRAME_BYTES

    return TCP_PAYLOAD_BYTES / FRAME_BYTES, "constant"


def at_rate(preset: Mapping[str, Any], rate_bytes_per_s: float) -> dict[str, Any]:
    """A copy of the calibrated ``preset`` with its host links shaped to
    ``rate_bytes_per_s`` (tbf's rate, as ``sim real --bandwidth`` gives it) instead of the
    rate it was measured at; see the module's docs for what moves and what is kept.
    ``ValueError`` if ``preset`` is not calibrated or the rate is not positive."""
    from simcore.units import format_rate

    if not is_calibrated(preset):
        raise ValueError("not a calibrated preset (sim calibrate writes those)")
    if not rate_bytes_per_s > 0:
        raise ValueError(f"the link rate must be positive, got {rate_bytes_per_s}")
    out = copy.deepcopy(dict(preset))
    share, source = goodput_share(preset)
    network = dict(out.get("network") or {})
    network["bandwidth"] = format_rate_text(rate_bytes_per_s * share)
    if "burst" in network:
        network["burst"] = f"{round(burst_payload_bytes(rate_bytes_per_s))}B"
    ladder = _measured(preset).get("flows")
    if ladder:  # concurrent flows, measured at several rates: the spread depends on it
        from realrun.flows import at

        share_now, spread_now = at(ladder, rate_bytes_per_s)
        network["flow_share"] = round(share_now, 4)
        network["flow_spread"] = round(spread_now, 4)
    out["network"] = network
    measured = dict(_measured(preset))
    was = measured.get("tbf_rate")
    measured["tbf_rate"] = format_rate_text(rate_bytes_per_s)
    measured["moved_from"] = {
        "tbf_rate": was,
        "goodput_share": share,
        "goodput_share_source": source,
    }
    out["measured"] = measured
    old_name = str(preset.get("name", "calibrated"))
    out["name"] = f"{old_name}@{format_rate(rate_bytes_per_s).replace(' ', '')}"
    return out
