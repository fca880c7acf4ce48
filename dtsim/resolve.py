"""From a :class:`~dtsim.spec.RunSpec` (names, strings) to a :class:`SimConfig` (objects).

This is where names meet files: built-in traces and trace files (via :mod:`traces`),
topology presets (YAML files shipped in ``dtsim/presets/topologies``, or a preset file
given by path) and the GPU table used to rescale traces between devices.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Any

import yaml

from dtsim.spec import RunSpec
from simcore.config import ConfigError, SimConfig, options_from_mapping, parse_quantity
from simcore.schemes import get_scheme
from simcore.topology import TopologySpec
from simcore.units import parse_rate, parse_size
from traces import default_model, load_trace
from traces.errors import UnknownModelError
from traces.model import Trace

_PRESETS = "dtsim.presets"


@cache
def topology_presets() -> dict[str, dict[str, Any]]:
    """Built-in topology presets by name, sorted."""
    folder = resources.files(_PRESETS).joinpath("topologies")
    out: dict[str, dict[str, Any]] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            out[str(data["name"])] = data
    return dict(sorted(out.items()))


def load_preset(name: str) -> dict[str, Any]:
    """A topology preset by built-in name or YAML file path (``ConfigError`` listing the
    built-in names when it is neither)."""
    presets = topology_presets()
    if name in presets:
        return presets[name]
    if os.path.exists(name):
        try:
            with open(name, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            from traces.errors import unreadable

            first = (unreadable(exc) if isinstance(exc, (OSError, UnicodeDecodeError))
                     else str(exc).strip().splitlines()[0])
            raise ConfigError("topology", name, f"cannot be read as a preset ({first})") from None
        if not isinstance(data, dict) or "box" not in data:
            raise ConfigError("topology", name, "a preset file needs at least a 'box' section "
                                                "(see dtsim/presets/topologies/*.yaml)")
        data.setdefault("name", os.path.splitext(os.path.basename(name))[0])
        return data
    raise ConfigError("topology", name, f"choose one of: {', '.join(presets)}, "
                                        "or give a preset YAML file")


@cache
def gpu_peak_flops() -> dict[str, float]:
    """Peak fp32 FLOP/s per GPU model (``dtsim/presets/gpus.yaml``)."""
    text = resources.files(_PRESETS).joinpath("gpus.yaml").read_text(encoding="utf-8")
    return {str(k): float(v) for k, v in yaml.safe_load(text).items()}


@cache
def _cached_trace(model: str, mtime: float) -> Trace:
    return load_trace(model)


def resolve_trace(model: str) -> Trace:
    """The trace for a model name or file (files are re-read when they change)."""
    name = model or default_model()
    mtime = os.path.getmtime(name) if os.path.exists(name) else 0.0
    try:
        return _cached_trace(name, mtime)
    except UnknownModelError as exc:
        raise ConfigError("model", name, str(exc).split(": ", 1)[-1]) from None


def device_scale(trace_device: str, gpu_model: str, gpu_peak: float) -> float:
    """Throughput ratio of the target GPU over the trace's device, by peak FLOPs; 1.0 when
    the trace's device is not in the GPU table (e.g. a CPU trace). An analytic trace's
    device ``analytic:<FLOP/s>`` names its peak directly."""
    table = gpu_peak_flops()
    if trace_device.startswith("analytic:"):
        try:
            peak = float(trace_device.removeprefix("analytic:"))
        except ValueError:
            return 1.0
        return gpu_peak / peak if peak > 0 else 1.0
    if trace_device == gpu_model or trace_device not in table:
        return 1.0
    return gpu_peak / table[trace_device]


def build_config(spec: RunSpec, *, record_spans: bool = True) -> SimConfig:
    """The :class:`SimConfig` for ``spec``; ``ConfigError`` (or a trace error) names any
    bad value and what is allowed."""
    scheme = get_scheme(spec.scheme)
    options = options_from_mapping(scheme.Options, spec.scheme_options, prefix="scheme.")
    trace = resolve_trace(spec.model)
    preset = load_preset(spec.topology)
    bandwidth = parse_quantity(parse_rate, spec.bandwidth, "bandwidth") if spec.bandwidth else None
    topo = TopologySpec(preset=preset, gpus=spec.gpus, bandwidth_bytes_per_s=bandwidth,
                        nic_per_gpu=spec.nic_per_gpu)
    scale = spec.compute_scale
    if not scale:
        gpu = preset.get("gpu") or {}
        try:
            peak = float(gpu.get("peak_flops", gpu_peak_flops().get(str(gpu.get("model")), 0))
                         or 0)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError("topology", spec.topology,
                              f"gpu.peak_flops must be a number of FLOP/s such as 15.7e12 "
                              f"({exc})") from None
        scale = device_scale(trace.meta.device, str(gpu.get("model", "")), peak) if peak else 1.0
    return SimConfig(
        trace=trace, topology=topo, scheme=spec.scheme, options=options,
        batch_size=spec.batch_size or None, iterations=spec.iterations,
        warmup_iterations=spec.warmup_iterations, seed=spec.seed, fidelity=spec.fidelity,
        chunk_bytes=parse_size(spec.chunk_bytes), compute_jitter=spec.compute_jitter,
        compute_scale=scale, optimizer=spec.optimizer, record_spans=record_spans,
    )


def run_spec(spec: RunSpec, *, record_spans: bool = True) -> Any:
    """Resolve and simulate ``spec``; returns the :class:`~simcore.result.RunResult`."""
    from simcore.engine import simulate

    return simulate(build_config(spec, record_spans=record_spans))
