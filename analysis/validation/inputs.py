"""What a validation's predictions are made from, measured on this machine.

The emulated cluster's **calibration**, once per link rate or once at one rate that
every case is moved to (:func:`prepare_calibrations`; the host's wake-up wait fitted
over all of them, :func:`pool_calibrations`), kept as ``calibration/<bandwidth>.yaml``;
where a case's calibration came from, as a row's columns (:func:`calibration_columns`).
The model's **profile**, one per model, inside the data-parallel runtime on two ranks
sharing the machine's cores at two batch sizes (:func:`ensure_trace`), kept as
``traces/...json`` with its optimizer step's cost; and the case's preset: the
calibration with the costs measured with a trace (:func:`case_topology`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from analysis.matrix_defaults import BATCH
from analysis.validation.matrix import Case, bandwidth_label, zoo_model
from simcore.config import ConfigError
from traces.atomic import write_text

PROFILE_BATCHES = (BATCH // 4, BATCH)
"""The batch sizes every model's profile is measured at (:func:`ensure_trace`): the
development matrix's batch and its quarter (GPipe's micro-batch there); other batches
and micro-batches are predicted from them."""

PROFILE_RANKS = 2
"""Data-parallel ranks a profile is measured on (:func:`profile_ranks`): the fewest that
any case of the CPU matrices runs, so that the profile computes on a machine whose cores
are shared as every case's ranks share them."""


def profile_ranks() -> int:
    """:data:`PROFILE_RANKS`, or fewer where this machine has fewer cores."""
    from realrun.guard import machine_cores

    return max(1, min(PROFILE_RANKS, machine_cores()))


Calibrator = Callable[[float], Mapping[str, Any]]
"""``calibrator(rate_bytes_per_s) -> topology preset mapping``."""


def default_calibrator(rate_bytes_per_s: float) -> Mapping[str, Any]:
    """Calibrate the emulated cluster at this link rate (:mod:`realrun.calibration`)."""
    from realrun.calibration.run import calibrate

    return calibrate(cluster="netns", bandwidth_bytes_per_s=rate_bytes_per_s)


def calibration_path(out_dir: str, rate_bytes_per_s: float) -> str:
    """Where the calibrated preset of this rate lives in a validation's output folder."""
    return os.path.join(out_dir, "calibration", f"{bandwidth_label(rate_bytes_per_s)}.yaml")


def ensure_calibration(
    out_dir: str, rate_bytes_per_s: float, calibrator: Calibrator = default_calibrator
) -> str:
    """The calibrated preset file for this rate: the one already in ``out_dir``, or a new
    one (calibrated now, written atomically)."""
    path = calibration_path(out_dir, rate_bytes_per_s)
    if os.path.exists(path):
        return path
    from realrun.calibration.preset import write_calibration

    preset = dict(calibrator(rate_bytes_per_s))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_calibration(preset, path)
    return path


def pool_calibrations(out_dir: str) -> list[str]:
    """Fit the host's wake-up wait once over every calibration in ``out_dir``
    (:func:`realrun.calibration.simfits.pool_wakeup`) and write it into each of them; the files
    that changed. The busy-cores benchmark behind it runs on unshaped links, so each
    bandwidth's calibration measures the same host property, and a single run of it
    moves with the machine's scheduling from one minute to the next (seen 1.55-2.1 ms
    between two calibrations started a minute apart); the validation's cases all get
    the wait fitted to every run."""
    import yaml

    from realrun.calibration.preset import write_calibration
    from realrun.calibration.simfits import pool_wakeup

    paths = calibration_files(out_dir)
    presets = []
    for path in paths:
        with open(path) as fh:
            presets.append(yaml.safe_load(fh))

    def pooled(preset: Mapping[str, Any]) -> tuple[Any, Any]:
        fits = (preset.get("measured") or {}).get("fits") or {}
        return (preset.get("host") or {}).get("wakeup_s"), fits.get("wakeup_pooled_over")

    changed = []
    for path, before, after in zip(paths, presets, pool_wakeup(presets), strict=True):
        (was, over), (now, now_over) = pooled(before), pooled(after)
        if over != now_over or not math.isclose(was or 0.0, now or 0.0, rel_tol=1e-4):
            write_calibration(after, path)
            changed.append(path)
    return changed


def calibration_files(out_dir: str) -> list[str]:
    """The calibrated preset files in ``out_dir/calibration/``, sorted."""
    d = os.path.join(out_dir, "calibration")
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".yaml"))


def prepare_calibrations(
    cases: Sequence[Case],
    out_dir: str,
    *,
    topology_file: str | None = None,
    calibrate_at: float | None = None,
    calibrator: Calibrator = default_calibrator,
    progress: Callable[[Case, str], None] | None = None,
) -> dict[float, str]:
    """The preset file each case's link rate is simulated on: ``topology_file`` for every
    rate where given (a calibrated one is moved to each case's rate when simulated);
    else one calibration at ``calibrate_at`` for every rate (the what-if across link
    rates); else one calibration per rate, all taken before the first case so that the
    host's wake-up wait is fitted over all of them (:func:`pool_calibrations`). Kept in
    ``out_dir/calibration/`` and reused."""
    rates = list(dict.fromkeys(c.bandwidth_bytes_per_s for c in cases))
    if topology_file is not None:
        return dict.fromkeys(rates, topology_file)
    if calibrate_at is not None:
        if not (calibrate_at > 0 and math.isfinite(calibrate_at)):
            raise ConfigError("calibrate_at", calibrate_at, "expected a positive link rate")
        if not os.path.exists(calibration_path(out_dir, calibrate_at)) and progress and cases:
            progress(replace(cases[0], bandwidth_bytes_per_s=calibrate_at), "calibrate")
        return dict.fromkeys(rates, ensure_calibration(out_dir, calibrate_at, calibrator))
    fresh = False
    calibrations: dict[float, str] = {}
    for case in cases:
        rate = case.bandwidth_bytes_per_s
        if rate in calibrations:
            continue
        if not os.path.exists(calibration_path(out_dir, rate)):
            if progress:
                progress(case, "calibrate")
            fresh = True
        calibrations[rate] = ensure_calibration(out_dir, rate, calibrator)
    if fresh:
        pool_calibrations(out_dir)
    return calibrations


def trace_path(
    out_dir: str,
    model: str,
    batches: tuple[int, ...],
    input_shape: tuple[int, ...] | None = None,
    ranks: int = 1,
) -> str:
    """Where the profile of ``model`` measured at ``batches`` on ``ranks`` ranks lives."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.rsplit("/", 1)[-1])
    if input_shape is not None:
        safe += "-" + "x".join(map(str, input_shape))
    if not zoo_model(model):  # two files of one name in different folders differ
        safe += "-" + hashlib.sha256(model.encode()).hexdigest()[:6]
    sizes = "-".join(str(b) for b in batches)
    on = f"-r{ranks}" if ranks > 1 else ""
    return os.path.join(out_dir, "traces", f"{safe}-runtime-b{sizes}{on}.json")


def ensure_trace(out_dir: str, case: Case) -> tuple[str, dict[str, float]]:
    """The profile of ``case``'s model, one per model for every case of a validation
    (every scheme, rank count, link rate, stage cut, batch and micro-batch), and its
    optimizer step's cost (``memory_bandwidth_bytes_per_s``, ``step_overhead_s``);
    measured now where ``out_dir`` does not hold it yet.

    It is :func:`realrun.runtime_profile.profile_in_runtime`'s profile, as ``sim profile
    --in-runtime --ranks N`` takes it: the data-parallel runtime on :func:`profile_ranks`
    ranks on this machine's loopback, at :data:`PROFILE_BATCHES` samples each (a layer's
    time fitted as a fixed part plus a part per sample), so a case at another batch, or a
    pipeline's micro-batch, is predicted from it, not profiled. Nothing comes from the
    case's own runtime. The per-layer profile that gives the structure (parameters,
    activations, the graph) is kept beside it (``.layers.json``), and so is the machine's
    compute probe taken right after it (``.probe.json``, :func:`machine_probe_s`), which
    each case's row compares with its own (``machine_vs_profile``)."""
    ranks = profile_ranks()
    path = trace_path(out_dir, case.model, PROFILE_BATCHES, case.input_shape, ranks)
    rate_path = path.removesuffix(".json") + ".update.json"
    if os.path.exists(path) and os.path.exists(rate_path):
        with open(rate_path, encoding="utf-8") as fh:
            return path, json.load(fh)
    from realrun.profiler import ProfileConfig, profile_model
    from realrun.runtime_profile import profile_in_runtime
    from traces.jsonfmt import save

    base = profile_model(
        case.model,
        ProfileConfig(batch_size=max(PROFILE_BATCHES), progress=False),
        case.input_shape,
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save(base, path.removesuffix(".json") + ".layers.json")
    profile = profile_in_runtime(
        case.model, PROFILE_BATCHES, input_shape=case.input_shape, structure=base, ranks=ranks
    )
    tmp_path = path + ".tmp.json"
    save(profile.trace, tmp_path)
    os.replace(tmp_path, path)
    update = profile.update_mapping()
    write_text(rate_path, json.dumps(update))
    write_text(probe_path(path), json.dumps({"probe_s": machine_probe_s()}))
    return path, update


def probe_path(trace_file: str) -> str:
    """Where :func:`ensure_trace` keeps the machine's compute probe taken with the
    profile (:func:`machine_probe_s`), beside the trace."""
    return trace_file.removesuffix(".json") + ".probe.json"


def profile_probe_s(trace_file: str) -> float | None:
    """The compute probe taken with the profile ``trace_file``; ``None`` for a profile
    taken before probes were kept."""
    try:
        with open(probe_path(trace_file), encoding="utf-8") as fh:
            return float(json.load(fh)["probe_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def machine_probe_s() -> float | None:
    """:func:`realrun.runtime_profile.compute_probe_s` now: the machine's speed at a
    fixed step of single-thread compute; ``None`` without torch."""
    try:
        from realrun.runtime_profile import compute_probe_s
    except ImportError:
        return None
    return compute_probe_s()


def case_preset_path(trace_file: str, topology_file: str) -> str:
    """Where :func:`case_topology` keeps the case preset of ``trace_file`` on
    ``topology_file``: beside the trace, named after both."""
    stem = os.path.basename(topology_file).removesuffix(".yaml")
    return trace_file.removesuffix(".json") + f"-{stem}.yaml"


def case_topology(
    out_dir: str,
    topology_file: str,
    trace_file: str,
    update: Mapping[str, float],
    source: str = "profile",
) -> str:
    """The calibrated preset with the optimizer step's cost measured with the trace (its
    memory bandwidth and fixed overhead, :func:`realrun.metrics.update_cost`) and, where
    ``update`` has them, SpecTrain's fixed cost of a weight prediction
    (``predict_overhead_s``), the messaging CPU per message (``p2p_message_cpu_s``),
    the sending thread's hold per ``isend`` (``isend_s``) and a pipeline's transport
    threads' CPU per message end (``posted_cpu_s``) measured in the same run; next
    to the trace; the calibration itself is left as measured. ``measured.sources`` says
    where each setting came from (:data:`realrun.calibrated.KNOBS`): the optimizer step's
    from ``source`` (``profile`` for a prediction, ``run`` for a replay), the rest from
    the run (a replay's alone)."""
    from analysis.resolve import load_preset
    from simcore.preset_keys import canonical

    preset = canonical(load_preset(topology_file))  # keys by field name
    from realrun.calibrated import knob_sources

    measured = dict(preset.get("measured") or {})
    sources = dict(measured.get("sources") or knob_sources(preset))  # (older files: none)
    sources["gpu.memory_bandwidth_bytes_per_s"] = sources["gpu.step_overhead_s"] = source
    if "predict_overhead_s" in update:
        sources["gpu.predict_overhead_s"] = "run"
    for key in ("p2p_message_cpu_s", "isend_s", "posted_cpu_s"):
        if key in update:
            sources[f"host.{key}"] = "run"
    if "p2p_message_cpu_s" in update:  # the run's figure is its messages' at every load
        sources["host.p2p_message_busy_cpu_s"] = "run"
    preset["measured"] = {**measured, "sources": sources}
    preset["gpu"] = {
        **dict(preset.get("gpu") or {}),
        "memory_bandwidth_bytes_per_s": f"{update['memory_bandwidth_bytes_per_s']:.6g}B/s",
        "step_overhead_s": f"{update.get('step_overhead_s', 0.0) * 1e6:.6g}us",
    }
    if "predict_overhead_s" in update:
        preset["gpu"]["predict_overhead_s"] = f"{update['predict_overhead_s'] * 1e6:.6g}us"
    for key in ("p2p_message_cpu_s", "isend_s", "posted_cpu_s"):
        if key in update:
            preset["host"] = {**dict(preset.get("host") or {}), key: float(update[key])}
    if "p2p_message_cpu_s" in update:
        preset["host"]["p2p_message_busy_cpu_s"] = 0.0
    path = case_preset_path(trace_file, topology_file)
    if not os.path.exists(path):
        import yaml

        write_text(path, yaml.safe_dump(preset, sort_keys=False))
    return path


def calibration_columns(calibration: str, case_rate_bytes_per_s: float) -> dict[str, Any]:
    """Where a case's calibration came from: its file, when it was measured, its age now
    (hours) and the link rate it was measured at (``moved`` when that is not the case's:
    the what-if :func:`realrun.calibrated.at_rate` makes)."""
    import datetime

    from analysis.resolve import load_preset, parse_when
    from realrun.calibrated import calibrated_rate

    preset = load_preset(calibration)
    measured = preset.get("measured") if isinstance(preset.get("measured"), Mapping) else {}
    when = parse_when((measured or {}).get("date"))
    age_h = (
        (datetime.datetime.now(datetime.UTC) - when).total_seconds() / 3600 if when else math.nan
    )
    rate = calibrated_rate(preset)
    return {
        "calibration": os.path.abspath(calibration) if os.path.exists(calibration) else calibration,
        "calibration_date": when.isoformat(timespec="minutes") if when else "",
        "calibration_age_h": age_h,
        "calibration_rate": bandwidth_label(rate) if rate else "",
        "calibration_moved": bool(rate) and not math.isclose(rate, case_rate_bytes_per_s),
    }
