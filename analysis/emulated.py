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
  steps on the host's CPU, a few milliseconds, not dilated);
* the links' uneven shares when every host sends (the calibration's concurrent flows):
  each uplink's rate is drawn per seed, and the prediction is the median of :data:`SEEDS`
  simulations, whose range is kept.

The run's times divided by K are the emulated cluster's, and so are the prediction's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from traces.emulated import EmulatedSpec, format_ref, load_run_trace, parse_ref


@dataclass(frozen=True)
class EmulatedPrediction:
    """What the simulator says of an emulated run.

    Attributes:
        run_iteration_time_s: the run's iteration time (dilated).
        iteration_time_s: the emulated cluster's (the run's / K).
        link_rate_bytes_per_s: the rate the run's links are shaped to (``None``: unshaped).
        calibration: the calibration file it was made with.
        result: the simulator's result of the run.
        config: the simulated configuration (a pipeline's real run takes its plan).
        seed_times_s: with a calibration that draws its uplinks' rates, the emulated
            cluster's iteration time for each seed simulated (sorted; the prediction is
            their median, :data:`SEEDS`); empty otherwise.
    """

    run_iteration_time_s: float
    iteration_time_s: float
    link_rate_bytes_per_s: float | None
    calibration: str
    result: Any
    config: Any = None
    seed_times_s: tuple[float, ...] = ()


def emulated_preset(
    preset: Mapping[str, Any], run_rate_bytes_per_s: float | None
) -> dict[str, Any]:
    """``preset`` (a calibration; any preset with a ``host`` section) at the run's link
    rate (``None``: its own) with its ranks' compute on a GPU (see module docs)."""
    from analysis.resolve import preset_at_rate
    from realrun.calibrated import format_rate_text
    from simcore.preset_keys import canonical

    out, override = preset_at_rate(dict(preset), run_rate_bytes_per_s)
    out = canonical(out)
    if override is not None:  # not calibrated: the rate as the network's bandwidth
        network = dict(out.get("network") or {})
        out["network"] = {**network, "bandwidth_bytes_per_s": format_rate_text(override)}
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
    calibration file ``calibration``; ``options`` are the cluster's (sizes are scaled
    here, :func:`scaled_options`)."""
    from analysis.resolve import build_config, load_preset
    from realrun.calibration.fits import segment_bytes
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
        scaled = scaled_options(scheme, options, spec.byte_scale)
        settings.update({f"scheme.{k}": v for k, v in scaled.items()})
        config = build_config(RunSpec().replace(**settings), record_spans=False)
        net = preset.get("network") or {}
        drawn = float(net.get("flow_spread", 0.0)) > 0  # uplink rates drawn per seed
        seeds = range(SEEDS) if drawn else range(1)
        runs = sorted(
            (simulate(replace(config, seed=seed)) for seed in seeds),
            key=lambda r: float(r.iteration_time_s),
        )
    result = runs[len(runs) // 2]
    t = float(result.iteration_time_s)
    times = tuple(float(r.iteration_time_s) / spec.dilation for r in runs) if drawn else ()
    return EmulatedPrediction(
        t, t / spec.dilation, run_rate, calibration, result, config, seed_times_s=times
    )


SEEDS = 5
"""Simulations per prediction when the calibration draws the uplinks' rates
(``network.flow_spread``): seeds 0 .. SEEDS - 1; the median is the prediction."""


ROUNDING_TOLERANCE = 0.01
"""Most an emulated model's parameter bytes may differ from the trace's / byte scale
through rounding each layer to whole elements."""


def model_ref(
    trace_ref: str,
    *,
    batch_size: int | None,
    dilation: float,
    byte_scale: float | None,
    ranks: int,
    hosts: int,
    cluster_rate_bytes_per_s: float | None,
    memory_bytes: int | None = None,
) -> str:
    """The reference of the emulated model of trace ``trace_ref`` (a built-in trace or a
    file) at ``batch_size`` (the trace's own when ``None``), ``dilation`` and
    ``byte_scale`` (``None``: :func:`realrun.guard.auto_byte_scale` for ``ranks`` ranks on
    ``hosts`` hosts whose links run at ``cluster_rate_bytes_per_s / dilation``, ``None``:
    unshaped, in ``memory_bytes``, the memory free now when ``None``). ``ConfigError``
    naming ``model``, ``dilation`` or ``byte_scale`` when it cannot be made."""
    from realrun.guard import auto_byte_scale, available_memory
    from simcore.config import ConfigError
    from traces.catalog import TraceFormatError, UnknownModelError, load_trace
    from traces.emulated import param_elements

    try:
        trace = load_trace(trace_ref)
    except UnknownModelError as exc:
        raise ConfigError(
            "model", trace_ref, f"{exc} (an emulated device runs a layer trace)"
        ) from None
    except TraceFormatError as exc:
        raise ConfigError("model", trace_ref, str(exc)) from None
    if not dilation >= 1:
        raise ConfigError("dilation", dilation, "need at least 1")
    scale = byte_scale
    if scale is None:
        rate = cluster_rate_bytes_per_s / dilation if cluster_rate_bytes_per_s else None
        memory = available_memory() if memory_bytes is None else memory_bytes
        scale = auto_byte_scale(trace.param_bytes, ranks, hosts, rate, memory)
    if not scale >= 1:
        raise ConfigError("byte_scale", scale, "need at least 1")
    name = os.path.abspath(trace_ref) if os.path.exists(trace_ref) else trace_ref
    try:
        spec = EmulatedSpec(
            name, batch_size or trace.meta.batch_size, float(dilation), float(scale)
        )
    except ValueError as exc:
        raise ConfigError("model", trace_ref, str(exc)) from None
    ideal = trace.param_bytes / spec.byte_scale
    scaled = sum(param_elements(lay.param_bytes, spec.byte_scale) for lay in trace.layers) * 4
    if ideal > 0 and abs(scaled - ideal) > ROUNDING_TOLERANCE * ideal:
        raise ConfigError(
            "byte_scale",
            scale,
            f"it leaves layers of {trace_ref} so small that rounding them to whole elements "
            f"changes the parameters by {abs(scaled - ideal) / ideal:.0%} (at most "
            f"{ROUNDING_TOLERANCE:.0%}); use a smaller one",
        )
    return format_ref(spec)


COUNT_OPTIONS = {("p3", "slice_params")}
"""Scheme options that count parameters (bytes in all but name)."""


def scaled_options(scheme: str, options: Mapping[str, Any], byte_scale: float) -> dict[str, Any]:
    """``scheme``'s options (``options`` over its defaults) with every size divided by
    ``byte_scale`` (whole, at least 1): DDP's buckets, the parameter server's big-array
    threshold, P3's slice. A model B times smaller then splits into the same buckets,
    shards and slices, so the emulated run sends as many messages as the cluster it
    stands for."""
    import dataclasses

    from simcore.config import options_from_mapping
    from simcore.schemes import get_scheme

    cls = get_scheme(scheme)
    opts = options_from_mapping(cls.Options, dict(options), prefix="scheme.")
    out: dict[str, Any] = {}
    for f in dataclasses.fields(opts):
        value = getattr(opts, f.name)
        if f.metadata.get("kind") == "bytes" or (scheme, f.name) in COUNT_OPTIONS:
            value = max(1, round(value / byte_scale))
        out[f.name] = value
    return out
