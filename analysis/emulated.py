"""The simulator's side of an emulated-device run: what ``sim run`` predicts for it.

A real run on emulated devices (:mod:`realrun.emudevice`) computes on a device that takes
the trace's times (dilated K times) without CPU, and communicates for real over links
shaped to the emulated cluster's rate divided by K x B (:mod:`traces.emulated`). The
simulator predicts exactly that run, from what was known before it:

* the model: the run's own trace (:func:`traces.emulated.load_run_trace`: times x K,
  sizes / B), the same layers and bytes the real model has;
* the hosts: a calibration of this machine's emulated cluster (``sim calibrate``, which
  runs no case) moved to the run's link rate (:func:`realrun.calibrated.at_rate`), with
  the ranks' compute on a GPU (``gpu.kind: gpu``) rather than on the hosts' shared cores:
  what is left on the cores is the framework's and communication's work, the
  calibration's per-message and per-byte host costs;
* the optimizer step: a GPU's, from the calibration's memory bandwidth (the emulated run
  steps on the host's CPU, a few milliseconds, not dilated).

The run's times divided by K are the emulated cluster's, and so are the prediction's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from traces.emulated import EmulatedSpec, load_run_trace, parse_ref


@dataclass(frozen=True)
class EmulatedPrediction:
    """What the simulator says of an emulated run.

    Attributes:
        run_iteration_time_s: the run's iteration time (dilated).
        iteration_time_s: the emulated cluster's (the run's / K).
        link_rate_bytes_per_s: the rate the run's links are shaped to (``None``: unshaped).
        calibration: the calibration file it was made with.
        result: the simulator's result of the run.
    """

    run_iteration_time_s: float
    iteration_time_s: float
    link_rate_bytes_per_s: float | None
    calibration: str
    result: Any


def emulated_preset(
    preset: Mapping[str, Any], run_rate_bytes_per_s: float | None
) -> dict[str, Any]:
    """``preset`` (a calibration; any preset with a ``host`` section) at the run's link
    rate (``None``: its own) with its ranks' compute on a GPU (see module docs)."""
    from analysis.resolve import preset_at_rate
    from realrun.calibrated import format_rate_text

    out, override = preset_at_rate(dict(preset), run_rate_bytes_per_s)
    out = dict(out)
    if override is not None:  # not calibrated: the rate as the network's bandwidth
        out["network"] = {**dict(out.get("network") or {}), "bandwidth": format_rate_text(override)}
    gpu = dict(out.get("gpu") or {})
    gpu["kind"] = "gpu"
    gpu["model"] = "emulated device"
    out["gpu"] = gpu
    out["name"] = f"{out.get('name', 'calibrated')} (emulated devices)"
    return out


def predict(
    ref: str,
    scheme: str,
    workers: int,
    options: Mapping[str, Any],
    calibration: str,
    cluster_rate_bytes_per_s: float | None,
    *,
    optimizer: str = "momentum",
    iterations: int = 5,
    warmup_iterations: int = 1,
) -> EmulatedPrediction:
    """The simulator's prediction of a real run of ``scheme`` on ``workers`` emulated
    devices running model ``ref`` (an ``emulated:`` reference) over links of
    ``cluster_rate_bytes_per_s`` (the emulated cluster's; ``None``: unshaped), with the
    calibration file ``calibration``."""
    from analysis.resolve import build_config, load_preset
    from realrun.calibrate import segment_bytes
    from simcore.engine import simulate
    from simcore.spec import RunSpec
    from traces.jsonfmt import save

    spec: EmulatedSpec = parse_ref(ref)
    run_rate = cluster_rate_bytes_per_s / spec.rate_divisor if cluster_rate_bytes_per_s else None
    preset = emulated_preset(load_preset(calibration), run_rate)
    with tempfile.TemporaryDirectory(prefix="dtsim-emulated-") as tmp:
        trace_file = os.path.join(tmp, "trace.json")
        save(load_run_trace(ref), trace_file)
        topology_file = os.path.join(tmp, "hosts.yaml")
        with open(topology_file, "w", encoding="utf-8") as fh:
            yaml.safe_dump(preset, fh, sort_keys=False)
        settings: dict[str, Any] = {
            "scheme": scheme,
            "gpus": workers,
            "model": trace_file,
            "topology": topology_file,
            "batch_size": spec.batch_size,
            "optimizer": optimizer,
            "iterations": iterations,
            "warmup_iterations": warmup_iterations,
            "compute_scale": 1.0,
            "chunk_bytes": segment_bytes(preset),
        }
        settings.update({f"scheme.{k}": v for k, v in options.items()})
        result = simulate(build_config(RunSpec().replace(**settings), record_spans=False))
    t = float(result.iteration_time_s)
    return EmulatedPrediction(t, t / spec.dilation, run_rate, calibration, result)
