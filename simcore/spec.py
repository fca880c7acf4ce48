"""What a person asks for: :class:`RunSpec`, one run in names and values.

A ``RunSpec`` holds every setting of one run under the names a person uses (``scheme``,
``gpus``, ``bandwidth``...), plus ``scheme_options`` (``scheme.KEY``). It is the one
declaration of the run settings: its fields (with those it shares with
:class:`~simcore.config.SimConfig` through :class:`~simcore.config.RunSettings`) give the
``sim run`` flags and their help, the keys of ``--config`` files and ``--set``, the axes of
sweeps and the settings of the real runs. Values are converted to their types once, when a
spec is made (:func:`simcore.settings.convert`), whatever they were typed in.
:func:`analysis.resolve.build_config` turns a spec into the simulator's
:class:`~simcore.config.SimConfig`, reading traces and presets.

Values come from, in increasing precedence: the defaults here, a config file
(``--config FILE``, YAML or JSON, the same keys), the command-line flags, and ``--set
key=value`` pairs.

To add a setting, add a field here (or to :class:`~simcore.config.RunSettings` when the
simulator reads it too) declared with :func:`~simcore.settings.setting`; ``flag=N`` makes
it a ``sim run`` flag. A setting only the real runs read belongs to a subclass of
``RunSpec`` declared next to them (see ``docs/architecture.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from simcore.config import RunSettings
from simcore.settings import ConfigError, convert, normalise, setting

DEFAULT_TOPOLOGY = "pcie"
DEFAULT_GPUS = 8
DEFAULT_MODEL_BATCH = 64
"""Batch size of the default model (ResNet-50) when none is given: its built-in profile
was taken at batch 128, whose activations need 18.1 GiB per GPU in ``sim run --gpus 8
--scheme p3``, more than the default topology's 16 GiB V100; at 64 it needs 9.2 GiB."""


@dataclass(frozen=True, kw_only=True)
class RunSpec(RunSettings):
    """One simulation, as a person describes it (see module docs)."""

    gpus: int = setting(DEFAULT_GPUS, "number of GPUs", minimum=1, flag=2)
    model: str | None = setting(
        None,
        "built-in model (see 'sim models') or trace file",
        auto="resnet50",
        flag=3,
        metavar="NAME|FILE",
    )
    topology: str = setting(
        DEFAULT_TOPOLOGY,
        "topology preset (see 'sim topologies') or preset YAML file",
        flag=4,
        metavar="NAME|FILE",
    )
    bandwidth: float | None = setting(
        None,
        "inter-node link rate in bytes/s, or with a unit: 10Gbps, 100Gb/s, 25GB/s",
        kind="rate",
        positive=True,
        auto="the preset's",
        flag=5,
        metavar="RATE",
    )
    compute_scale: float | None = setting(
        None,
        "target GPU throughput / trace device throughput",
        kind="float",
        positive=True,
        auto="from the GPUs' peak FLOP/s",
        auto_zero=True,
    )
    nic_per_gpu: bool = setting(False, "one NIC per GPU instead of one per box")
    scheme_options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata={"doc": "scheme options (--set scheme.KEY=VALUE; sim schemes -v lists them)"},
    )

    def __post_init__(self) -> None:
        normalise(self)
        if not isinstance(self.scheme_options, MappingProxyType):
            object.__setattr__(self, "scheme_options", MappingProxyType(dict(self.scheme_options)))

    @property
    def effective_batch_size(self) -> int | None:
        """``batch_size``, or :data:`DEFAULT_MODEL_BATCH` when neither the model nor the
        batch is given; ``None`` leaves the trace's."""
        if self.batch_size is None and self.model is None:
            return DEFAULT_MODEL_BATCH
        return self.batch_size

    def replace(self, **changes: Any) -> RunSpec:
        """A copy with ``changes`` applied (validated like :func:`apply_settings`)."""
        return apply_settings(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dictionary of the fields (``scheme_options`` as a dict)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["scheme_options"] = dict(self.scheme_options)
        return d


def ordered_fields(spec_cls: type = RunSpec) -> dict[str, dataclasses.Field]:
    """The fields of ``spec_cls`` by name: the flags in ``--help`` order, then the others."""
    fields = dataclasses.fields(spec_cls)
    flags = sorted((f for f in fields if f.metadata.get("flag")), key=lambda f: f.metadata["flag"])
    return {f.name: f for f in [*flags, *(f for f in fields if not f.metadata.get("flag"))]}


FIELDS = ordered_fields(RunSpec)
"""The spec's fields by name (flags first)."""

FLAG_FIELDS = tuple(
    sorted(
        (n for n, f in FIELDS.items() if f.metadata.get("flag")),
        key=lambda n: FIELDS[n].metadata["flag"],
    )
)
"""Fields that ``sim run`` and ``sim sweep`` take as flags (``--batch-size``...), in the
order of ``--help``; the others are given with ``--set`` or a config file."""


def flag_fields(spec_cls: type = RunSpec) -> tuple[dataclasses.Field, ...]:
    """The fields of ``spec_cls`` (``RunSpec`` or a subclass) that are flags, in order."""
    return tuple(
        sorted(
            (f for f in dataclasses.fields(spec_cls) if f.metadata.get("flag")),
            key=lambda f: f.metadata["flag"],
        )
    )


def _convert(name: str, value: Any, fields: Mapping[str, dataclasses.Field] = FIELDS) -> Any:
    """``value`` converted to field ``name``'s type and checked against its limits."""
    return convert(fields[name], value, name)


def apply_settings(spec: Any, settings: Mapping[str, Any]) -> Any:
    """``spec`` with ``settings`` applied. Keys are field names or ``scheme.KEY``
    (``scheme_options`` may also be given whole, as a mapping). Unknown keys and bad values
    raise :class:`ConfigError` naming them and what is allowed."""
    fields = ordered_fields(type(spec))
    changes: dict[str, Any] = {}
    opts = dict(spec.scheme_options)
    for key, value in settings.items():
        key = key.replace("-", "_") if not key.startswith("scheme.") else key
        if key.startswith("scheme."):
            opts[key[len("scheme.") :]] = value
        elif key == "scheme_options":
            if not isinstance(value, Mapping):
                raise ConfigError(
                    "scheme_options", value, "expected a mapping of option names to values"
                )
            opts.update(value)
        elif key in fields:
            changes[key] = _convert(key, value, fields)
        else:
            known = ", ".join(n for n in fields if n != "scheme_options")
            raise ConfigError(key, value, f"known: {known}, scheme.KEY", unknown=True)
    changes["scheme_options"] = MappingProxyType(opts)
    return dataclasses.replace(spec, **changes)


def parse_set(
    items: tuple[str, ...] | list[str], flag: str = "set", example: str = "scheme.algorithm=tree"
) -> dict[str, str]:
    """``["a=1", "scheme.b=x"]`` -> ``{"a": "1", "scheme.b": "x"}`` (``ConfigError`` naming
    ``flag`` for an item without ``=``)."""
    flag = flag.lstrip("-")
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(flag, item, f"expected KEY=VALUE, e.g. --{flag} {example}")
        out[key.strip()] = value.strip()
    return out
