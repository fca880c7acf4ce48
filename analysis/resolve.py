"""From a :class:`~simcore.spec.RunSpec` (names, values) to a :class:`SimConfig` (objects).

This is where names meet files: built-in traces and trace files (via :mod:`traces`),
topology presets (YAML files shipped in ``simcore/presets/topologies``, or a preset file
given by path) and the GPU table used to rescale traces between devices. The command line
(:mod:`dtsim`), sweeps (:mod:`analysis`) and the real runs (:mod:`realrun`) all resolve
names here.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import yaml

from simcore.config import SHARED, ConfigError, SimConfig, options_from_mapping
from simcore.preset_keys import raw_value
from simcore.schemes import get_scheme
from simcore.spec import RunSpec
from simcore.topology import TopologySpec, parse_sections
from traces import default_model, load_trace
from traces.errors import UnknownModelError
from traces.model import Trace, TraceMeta

_PRESETS = "simcore.presets"
_BUILTIN_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""Loader of the shipped YAML files: libyaml's where PyYAML has it (the same data as
``yaml.safe_load``, a few times faster: every ``sim run`` reads all presets); files
a person gives keep ``yaml.safe_load`` and its error messages."""


@cache
def topology_presets() -> dict[str, dict[str, Any]]:
    """Built-in topology presets by name, sorted."""
    folder = resources.files(_PRESETS).joinpath("topologies")
    out: dict[str, dict[str, Any]] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            data = yaml.load(entry.read_text(encoding="utf-8"), Loader=_BUILTIN_LOADER)
            out[str(data["name"])] = data
    return dict(sorted(out.items()))


def load_preset(name: str) -> dict[str, Any]:
    """A topology preset by built-in name or YAML file path (``ConfigError`` listing the
    built-in names when it is neither), as written in the file; its machine sections are
    parsed here (:func:`simcore.topology.parse_sections`), so a bad key is a
    ``ConfigError`` naming the file and the key as written (``calib.yaml: host.wakeup_s:
    -0.001 is not allowed; must be at least 0``)."""
    presets = topology_presets()
    if name in presets:
        return _checked(presets[name], name)
    if os.path.exists(name):
        try:
            with open(name, encoding="utf-8") as fh:
                data = yaml.safe_load(fh)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            from traces.errors import unreadable

            first = (
                unreadable(exc)
                if isinstance(exc, OSError | UnicodeDecodeError)
                else str(exc).strip().splitlines()[0]
            )
            raise ConfigError("topology", name, f"cannot be read as a preset ({first})") from None
        if not isinstance(data, dict) or "box" not in data:
            raise ConfigError(
                "topology",
                name,
                "a preset file needs at least a 'box' section "
                "(see simcore/presets/topologies/*.yaml)",
            )
        data.setdefault("name", os.path.splitext(os.path.basename(name))[0])
        return _checked(data, name)
    raise ConfigError(
        "topology", name, f"choose one of: {', '.join(presets)}, or give a preset YAML file"
    )


def _checked(preset: dict[str, Any], name: str) -> dict[str, Any]:
    """``preset`` once its machine sections parse; a ``ConfigError`` naming ``name`` and
    the first bad key otherwise."""
    try:
        parse_sections(preset)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc.field}", exc.value, exc.allowed, exc.unknown) from None
    return preset


@cache
def gpu_peak_flops() -> dict[str, float]:
    """Peak fp32 FLOP/s per GPU model (``simcore/presets/gpus.yaml``)."""
    text = resources.files(_PRESETS).joinpath("gpus.yaml").read_text(encoding="utf-8")
    return {str(k): float(v) for k, v in yaml.load(text, Loader=_BUILTIN_LOADER).items()}


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


def device_scale(trace: TraceMeta | str, gpu_model: str, gpu_peak: float) -> float:
    """Throughput ratio of the target GPU over the trace's device, by peak FLOP/s; 1.0 when
    the trace's device is not in the GPU table (e.g. a CPU trace). An analytic trace
    carries its device's peak (:attr:`TraceMeta.peak_flop_per_s`). ``trace`` may be just
    a device name."""
    meta = trace if isinstance(trace, TraceMeta) else TraceMeta("", trace, 1)
    if meta.peak_flop_per_s > 0:
        return gpu_peak / meta.peak_flop_per_s
    table = gpu_peak_flops()
    trace_device = meta.device
    if trace_device == gpu_model or trace_device not in table:
        return 1.0
    return gpu_peak / table[trace_device]


DATE_DRIFT_S = 24 * 3600.0
"""Traces and calibrations measured further apart than this get a warning: compute on a
shared machine has been seen to drift by 40% between days."""


def same_device(a: str, b: str) -> bool:
    """Whether two device names name the same model: equal up to case and spaces, or one a
    run of whole words of the other (``A100`` and ``NVIDIA A100-SXM4-40GB``)."""
    na, nb = (" ".join(x.lower().split()) for x in (a, b))
    if not na or not nb:
        return False
    if na == nb:
        return True
    short, long = sorted((na, nb), key=len)
    return re.search(rf"(?<![\w.]){re.escape(short)}(?![\w.])", long) is not None


def parse_when(value: Any) -> datetime.datetime | None:
    """An ISO date or date-time (text, or what YAML made of it) as an aware UTC
    date-time; ``None`` when absent or unreadable (a date alone is its midnight, UTC; a
    time without zone is taken as UTC)."""
    if isinstance(value, datetime.datetime):
        when = value
    elif isinstance(value, datetime.date):
        when = datetime.datetime(value.year, value.month, value.day)
    elif isinstance(value, str) and value.strip():
        try:
            when = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def trace_origin_warnings(
    meta: TraceMeta,
    preset: Mapping[str, Any],
    compute_scale: float | None = None,
) -> list[str]:
    """Warnings (one line each, ``warning: ...``) when a trace's compute times were
    measured somewhere other than where the topology ``preset`` says its devices are.

    * **Device.** The trace's device (:attr:`TraceMeta.measured_on`: its GPU model, or its
      CPU model for a CPU trace) against the preset's ``gpu.model`` (for a calibrated CPU
      cluster, ``gpu: {kind: cpu, model: <CPU model name>}``) and ``measured.cpu``. No
      warning where the times are rescaled on purpose: an analytic trace (computed for a
      peak rate), a trace from a GPU of the table ``sim run`` rescales by peak FLOP/s, or
      an explicit ``compute_scale``.
    * **Date.** A measured trace's ``date`` and the preset's ``measured.date`` more than
      :data:`DATE_DRIFT_S` apart (compute drifts between days), whatever the scaling.
      ``measured.cpu`` is compared with CPU-measured traces only.
    """
    out: list[str] = []
    name = meta.model or "the trace"
    topo = str(preset.get("name", "the topology"))
    gpu = preset.get("gpu") or {}
    measured = preset.get("measured") or {}
    if not isinstance(gpu, Mapping):
        gpu = {}
    if not isinstance(measured, Mapping):
        measured = {}
    target = str(gpu.get("model") or "")
    claimed_cpu = str(measured.get("cpu") or "")
    on = meta.measured_on
    rescaled = meta.peak_flop_per_s > 0 or compute_scale is not None
    if not rescaled and target and not same_device(on, target):
        table = gpu_peak_flops()
        peak = raw_value(gpu, "gpu", "peak_flop_per_s", table.get(target, 0))
        rescaled = on in table and bool(peak)
    if not rescaled:
        on_cpu = not meta.gpu and meta.device.lower() == "cpu"
        claims = [c for c in (target, claimed_cpu if on_cpu else "") if c]
        wrong = [c for c in claims if not same_device(on, c)]
        if wrong:
            vague = " (the trace does not record which CPU)" if on.lower() == "cpu" else ""
            out.append(
                f"warning: {name} was measured on {on!r}{vague} but topology {topo} "
                f"claims {wrong[0]!r}; its compute times are used as measured (profile on "
                "the claimed machine, or --set compute_scale=X to rescale)"
            )
    if meta.peak_flop_per_s > 0:
        return out  # computed from FLOPs, not measured: no day to drift from
    t_trace, t_topo = parse_when(meta.date), parse_when(measured.get("date"))
    if t_trace and t_topo and abs((t_trace - t_topo).total_seconds()) > DATE_DRIFT_S:
        days = abs((t_trace - t_topo).total_seconds()) / 86400
        out.append(
            f"warning: {name} was measured on {t_trace.isoformat(timespec='minutes')} and "
            f"topology {topo} on {t_topo.isoformat(timespec='minutes')}, {days:.1f} days "
            "apart; compute on a shared machine drifts between days, so profile the model "
            "again (sim profile, or sim real --profile-out) when the topology is calibrated"
        )
    return out


def preset_at_rate(
    preset: dict[str, Any], bandwidth_bytes_per_s: float | None
) -> tuple[dict[str, Any], float | None]:
    """``(preset, bandwidth)`` for a run asked at ``bandwidth_bytes_per_s``: a calibrated
    preset (``sim calibrate``'s) is moved to that link rate
    (:func:`realrun.calibrated.at_rate`: the goodput is the measured share of the rate, the
    host costs stay as measured) and needs no override; any other preset keeps the rate as
    an override of its network's bandwidth (``None``: the preset's own)."""
    if bandwidth_bytes_per_s is None:
        return preset, None
    from realrun.calibrated import at_rate, is_calibrated

    if is_calibrated(preset):
        return at_rate(preset, bandwidth_bytes_per_s), None
    return preset, bandwidth_bytes_per_s


def build_config(spec: RunSpec, *, record_spans: bool = True) -> SimConfig:
    """The :class:`SimConfig` for ``spec``; ``ConfigError`` (or a trace error) names any
    bad value and what is allowed."""
    scheme = get_scheme(spec.scheme)
    options = options_from_mapping(scheme.Options, spec.scheme_options, prefix="scheme.")
    trace = resolve_trace(spec.model)
    preset, bandwidth = preset_at_rate(load_preset(spec.topology), spec.bandwidth)
    if trace.meta.step_bytes_per_s > 0:  # a profile taken inside the runtime (sim profile)
        from realrun.calibrated import with_profiled_step

        preset = dict(with_profiled_step(preset, trace.meta))
    topo = TopologySpec(
        preset=preset,
        gpus=spec.gpus,
        bandwidth_bytes_per_s=bandwidth,
        nic_per_gpu=spec.nic_per_gpu,
    )
    scale = spec.compute_scale
    if scale is None:
        # the preset's peak, else its model's in the GPU table (a preset naming no model
        # gives neither: its compute is the trace's)
        gpu, written = topo.sections.gpu, preset.get("gpu")
        model = raw_value(written, "gpu", "model")
        if raw_value(written, "gpu", "peak_flop_per_s") is not None:
            peak = gpu.peak_flop_per_s
        else:
            peak = gpu_peak_flops().get(str(model), 0.0)
        scale = (
            device_scale(trace.meta, gpu.model if model is not None else "", peak) if peak else 1.0
        )
    return SimConfig(
        trace=trace,
        topology=topo,
        options=options,
        compute_scale=scale,
        record_spans=record_spans,
        **{n: getattr(spec, n) for n in SHARED if n != "batch_size"},
        batch_size=spec.effective_batch_size,
    )


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON config file into a mapping of settings (``ConfigError`` if it
    cannot be read or is not a mapping)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        from traces.errors import unreadable

        raise ConfigError("config", p, f"cannot be read ({unreadable(exc)})") from None
    try:
        if p.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("config", p, f"is not valid YAML/JSON ({first})") from None
    if not isinstance(data, Mapping):
        raise ConfigError("config", p, "must contain a mapping of settings (key: value)")
    return dict(data)


def zoo_config(
    model: str,
    batch_size: int,
    gpus: int,
    scheme: str,
    options: Mapping[str, Any],
    optimizer: str = "momentum",
    iterations: int = 5,
    warmup_iterations: int = 1,
    input_shape: tuple[int, ...] | None = None,
) -> SimConfig:
    """The configuration ``sim run`` makes for model ``model`` (a zoo name, ``FILE.py:NAME``
    or ``package.module:NAME``, see :func:`realrun.usermodel.resolve_model`, with
    ``input_shape`` where it needs one) on an analytic trace of it (the real model's
    layers, names and bytes; times from FLOPs; an emulated model's own trace), one GPU per
    host on the ``ethernet`` preset: what a real run of that model is compared with."""
    import tempfile

    from realrun.profiler import ProfileConfig, profile_model
    from traces.emulated import is_emulated_ref, load_run_trace
    from traces.jsonfmt import save

    if is_emulated_ref(model):  # the trace it runs, as it runs it
        trace = load_run_trace(model)
    else:
        trace = profile_model(
            model,
            ProfileConfig(batch_size=batch_size, analytic=True, device_flops=1e12, progress=False),
            input_shape,
        )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        save(trace, path)
        settings = {
            "scheme": scheme,
            "gpus": gpus,
            "model": path,
            "topology": "ethernet",
            "batch_size": batch_size,
            "optimizer": optimizer,
            "iterations": iterations,
            "warmup_iterations": warmup_iterations,
        }
        settings.update({f"scheme.{k}": v for k, v in options.items()})
        return build_config(RunSpec().replace(**settings), record_spans=False)


def pipeline_plan(
    model: str,
    batch_size: int,
    gpus: int,
    scheme: str,
    options: Mapping[str, Any],
    optimizer: str = "momentum",
    input_shape: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The stages and micro-batches ``sim run`` would use to run model ``model`` (a zoo name
    or a reference, as in :func:`zoo_config`) with a pipeline scheme
    (:func:`realrun.job.pipeline_of` of :func:`zoo_config`): what ``sim real`` runs."""
    from realrun.job import pipeline_of

    return pipeline_of(
        zoo_config(model, batch_size, gpus, scheme, options, optimizer, input_shape=input_shape)
    )
