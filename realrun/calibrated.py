"""A calibrated topology file as a prediction input: its link rate, and the same
calibration moved to another rate.

``sim calibrate`` measures an emulated cluster whose links ``tc tbf`` shapes to one rate,
and writes what it measured as a topology preset (:func:`realrun.calibration.run.calibrate`):
``network.bandwidth_bytes_per_s`` is the TCP goodput the links carried, a share of the tbf
rate (``measured.fits.goodput_share_of_tbf_rate``, about 1448/1514 less tbf's losses),
and ``network.burst_bytes`` the payload of tbf's bucket at that rate. A what-if at another link rate
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

The moved copy names every key by its field name (:func:`simcore.preset_keys.canonical`),
whatever names the file used.

The link latency, the unshaped peak rate, the sharing lead, and every host cost (per
message, per byte, the links' packet work per byte, wake-up waits) are kept: they are
properties of the hosts and the veth pairs, which the rate does not change. Whether that
holds is what ``sim validate --calibrate-at`` measures. No torch; no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from simcore.preset_keys import KEYS, PresetKey, canonical, raw_value

__all__ = [
    "KNOBS",
    "at_rate",
    "burst_payload_bytes",
    "calibrated_rate",
    "format_rate_text",
    "format_time_text",
    "goodput_share",
    "is_calibrated",
    "knob_sources",
    "knob_table",
]


KNOBS: tuple[PresetKey, ...] = tuple(k for k in KEYS if k.source is not None)
"""Every setting of a calibrated file the simulator reads whose value is measured, fitted
or taken from a run: the machine-section keys with a source
(:data:`simcore.preset_keys.KEYS`, which declares them with their units and limits)."""


def knob_sources(preset: Mapping[str, Any]) -> dict[str, str]:
    """``{path: source}`` of the declared knobs ``preset`` sets (:data:`KNOBS`; paths by
    field name, whatever name the file uses)."""
    out = {}
    for knob in KNOBS:
        if raw_value(preset.get(knob.section), knob.section, knob.name) is not None:
            out[knob.path] = str(knob.source)
    return out


def knob_table() -> str:
    """The Markdown table of :data:`KNOBS` in docs/prediction.md: each setting's path,
    unit, source, allowed values, what it stands for and the older name files may give
    it."""
    rows = [
        "| setting | unit | source | limits | what | older name |",
        "|---|---|---|---|---|---|",
    ]
    for k in KNOBS:
        older = ", ".join(f"`{a}`" for a in k.aliases)
        rows.append(f"| `{k.path}` | {k.unit} | {k.source} | {k.limits} | {k.what} | {older} |")
    return "\n".join(rows)


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
    out = canonical(copy.deepcopy(dict(preset)))
    share, source = goodput_share(preset)
    network = dict(out.get("network") or {})
    network["bandwidth_bytes_per_s"] = format_rate_text(rate_bytes_per_s * share)
    if "burst_bytes" in network:
        network["burst_bytes"] = f"{round(burst_payload_bytes(rate_bytes_per_s))}B"
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


PROFILED = ("profile", "run")
"""Sources of a preset's optimizer step that a trace's measured step does not replace: a
validation's case preset already carries its profile's (or its run's) step."""


def with_profiled_step(preset: Mapping[str, Any], meta: Any) -> Mapping[str, Any]:
    """``preset`` with the optimizer step that the trace of ``meta``
    (:class:`traces.model.TraceMeta`) measured inside the training runtime
    (``sim profile --in-runtime``) as its ``gpu.memory_bandwidth_bytes_per_s`` and
    ``gpu.step_overhead_s``, sourced ``profile``; ``preset`` itself when it is not
    calibrated (a GPU preset's step is the GPU's), when the trace measured no step, or
    when the preset's step already came from a profile or a run."""
    rate = float(getattr(meta, "step_bytes_per_s", 0.0) or 0.0)
    if rate <= 0 or not is_calibrated(preset):
        return preset
    out = canonical(copy.deepcopy(dict(preset)))
    measured = dict(_measured(out))
    sources = dict(measured.get("sources") or knob_sources(out))
    if sources.get("gpu.memory_bandwidth_bytes_per_s") in PROFILED:
        return preset
    gpu = dict(out.get("gpu") or {})
    gpu["memory_bandwidth_bytes_per_s"] = format_rate_text(rate)
    gpu["step_overhead_s"] = format_time_text(float(meta.step_overhead_s))
    out["gpu"] = gpu
    sources["gpu.memory_bandwidth_bytes_per_s"] = sources["gpu.step_overhead_s"] = "profile"
    out["measured"] = {**measured, "sources": sources}
    return out
