"""What a person asks for: :class:`RunSpec`, in names and strings.

A ``RunSpec`` holds the fields of ``sim run`` under their flag names (``scheme``,
``gpus``, ``bandwidth``...), plus ``scheme_options`` (``--set scheme.KEY=VALUE``). Sweeps
vary exactly these fields. :func:`dtsim.resolve.build_config` turns a spec into the
simulator's :class:`~simcore.config.SimConfig`, reading traces and presets.

Values come from, in increasing precedence: the defaults here, a config file
(``--config FILE``, YAML or JSON, the same keys), the command-line flags, and ``--set
key=value`` pairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from simcore.config import TYPE_WORDS, ConfigError, parse_bool, parse_int
from simcore.units import UnitError, parse_size

DEFAULT_TOPOLOGY = "pcie"
DEFAULT_GPUS = 8


def _f(default: Any, help: str, typ: str | None = None, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, "type": typ, **meta})


@dataclass(frozen=True)
class RunSpec:
    """One simulation, as a person describes it (see module docs)."""

    scheme: str = _f("dp", "training scheme (sim schemes lists them)")
    gpus: int = _f(DEFAULT_GPUS, "number of GPUs", "int", minimum=1)
    model: str = _f("", "built-in model name or trace file (default: resnet50)")
    topology: str = _f(DEFAULT_TOPOLOGY, "topology preset name or preset YAML file")
    bandwidth: str = _f("", "inter-node link rate, e.g. 10Gbps, 25GB/s (default: preset's)")
    batch_size: int = _f(0, "samples per model replica per iteration (0: the trace's)", "int",
                         minimum=0)
    iterations: int = _f(5, "measured iterations", "int", minimum=1)
    warmup_iterations: int = _f(1, "warm-up iterations left out of the metrics", "int",
                                minimum=0)
    seed: int = _f(0, "random seed (compute jitter)", "int", minimum=0)
    fidelity: str = _f("detailed", "network model: detailed (chunked queues) or analytic "
                                   "(closed forms)", choices=("detailed", "analytic"))
    chunk_bytes: str = _f("1MiB", "message chunk size of the detailed model", "size")
    compute_jitter: float = _f(0.0, "coefficient of variation of compute times", "float",
                               minimum=0.0)
    compute_scale: float = _f(0.0, "target GPU throughput / trace device throughput "
                                   "(0: from peak FLOPs)", "float", minimum=0.0)
    optimizer: str = _f("momentum", "optimizer (memory and update time)",
                        choices=("sgd", "momentum", "adam"))
    nic_per_gpu: bool = _f(False, "one NIC per GPU instead of one per box", "bool")
    scheme_options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"help": "scheme options (--set scheme.KEY=VALUE; sim schemes -v lists them)"})

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes`` applied (validated like :func:`apply_settings`)."""
        return apply_settings(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary of the fields (``scheme_options`` as a dict)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["scheme_options"] = dict(self.scheme_options)
        return d


FIELDS = {f.name: f for f in dataclasses.fields(RunSpec)}
"""The spec's fields by name."""

FLAG_FIELDS = ("scheme", "gpus", "model", "topology", "bandwidth", "batch_size", "iterations",
               "seed", "fidelity")
"""Fields that ``sim run`` and ``sim sweep`` take as flags (``--batch-size``...); the others
are given with ``--set``."""


def _convert(name: str, value: Any) -> Any:
    """``value`` converted to field ``name``'s type and checked against its limits."""
    meta = FIELDS[name].metadata
    typ = meta.get("type")
    try:
        if typ == "int":
            out: Any = parse_int(value, name)
        elif typ == "float":
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if not math.isfinite(out):
                raise ValueError
        elif typ == "bool":
            out = parse_bool(value, name)
        elif typ == "size":
            parse_size(value)
            out = str(value)
        else:
            out = str(value)
    except UnitError as exc:
        raise ConfigError(name, value, f"expected {exc.expected}") from None
    except ValueError:
        raise ConfigError(name, value, f"expected {TYPE_WORDS.get(typ or 'str')}") from None
    choices = meta.get("choices")
    if choices and out not in choices:
        raise ConfigError(name, value, f"choose one of: {', '.join(choices)}")
    minimum = meta.get("minimum")
    if minimum is not None and out < minimum:
        raise ConfigError(name, value, f"must be at least {minimum:g}")
    return out


def apply_settings(spec: RunSpec, settings: Mapping[str, Any]) -> RunSpec:
    """``spec`` with ``settings`` applied. Keys are field names or ``scheme.KEY``
    (``scheme_options`` may also be given whole, as a mapping). Unknown keys and bad values
    raise :class:`ConfigError` naming them and what is allowed."""
    changes: dict[str, Any] = {}
    opts = dict(spec.scheme_options)
    for key, value in settings.items():
        key = key.replace("-", "_") if not key.startswith("scheme.") else key
        if key.startswith("scheme."):
            opts[key[len("scheme."):]] = value
        elif key == "scheme_options":
            if not isinstance(value, Mapping):
                raise ConfigError("scheme_options", value, "expected a mapping of option names "
                                                           "to values")
            opts.update(value)
        elif key in FIELDS:
            changes[key] = _convert(key, value)
        else:
            known = ", ".join(n for n in FIELDS if n != "scheme_options")
            raise ConfigError(key, value, f"known: {known}, scheme.KEY", unknown=True)
    changes["scheme_options"] = MappingProxyType(opts)
    return dataclasses.replace(spec, **changes)


def parse_set(items: tuple[str, ...] | list[str], flag: str = "--set",
              example: str = "scheme.algorithm=tree") -> dict[str, str]:
    """``["a=1", "scheme.b=x"]`` -> ``{"a": "1", "scheme.b": "x"}`` (``ConfigError`` naming
    ``flag`` for an item without ``=``)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(flag, item, f"expected KEY=VALUE, e.g. {flag} {example}")
        out[key.strip()] = value.strip()
    return out


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON config file into a mapping of settings (``ConfigError`` if it
    cannot be read or is not a mapping)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        from traces.errors import unreadable

        raise ConfigError("--config", p, f"cannot be read ({unreadable(exc)})") from None
    try:
        if p.endswith(".json"):
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError("--config", p, f"is not valid YAML/JSON ({first})") from None
    if not isinstance(data, Mapping):
        raise ConfigError("--config", p, "must contain a mapping of settings (key: value)")
    return dict(data)
