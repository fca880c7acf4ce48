"""Simulation configuration: frozen dataclasses with typed, documented fields.

:class:`SimConfig` is everything :func:`simcore.simulate` needs. Scheme options are
frozen dataclasses too, one per scheme, whose fields are declared with :func:`option` so
that values typed by people (``25MiB``, ``10Gbps``, ``true``) are converted once, at the
edge, by :func:`options_from_mapping`, with errors that name the field, the value and what
is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simcore.topology import Topology, TopologySpec
from simcore.units import UnitError, parse_rate, parse_size, parse_time
from traces.model import Trace

MIN_CHUNK_BYTES = 4096
"""Smallest chunk of the detailed network model."""

FIDELITIES = ("detailed", "analytic")
"""Network fidelities: chunked queues, or closed forms (see :mod:`simcore.network`)."""

OPTIMIZERS = {"sgd": (0, 3), "momentum": (1, 5), "adam": (2, 8)}
"""Optimizer -> (state copies of the weights, weight-sized memory passes per update).

State copies drive the memory model (momentum keeps one velocity per weight, Adam two
moments); passes drive the update time, ``passes * param_bytes / memory_bandwidth``
(an update is memory-bound: read weights, gradients and state, write weights and state).
"""


TYPE_WORDS = {"int": "an integer", "float": "a finite number", "bool": "true or false",
              "str": "a string"}
"""How messages name the type a value should have had."""


class ConfigError(ValueError):
    """A configuration value is not allowed. The message names the field, the bad value
    and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str, unknown: bool = False) -> None:
        self.field, self.value, self.allowed, self.unknown = field_name, value, allowed, unknown
        super().__init__(self.describe(field_name))

    def describe(self, shown_name: str) -> str:
        """The message, with the field shown as ``shown_name`` (e.g. a CLI flag)."""
        if self.unknown:
            return f"{shown_name}: unknown setting; {self.allowed}"
        return f"{shown_name}: {self.value!r} is not allowed; {self.allowed}"


def parse_quantity(parse: Callable[[Any], Any], value: Any, field_name: str) -> Any:
    """``parse(value)`` (a parser of :mod:`simcore.units`), with a :class:`ConfigError`
    naming ``field_name``, the value and the accepted forms when it does not parse."""
    try:
        return parse(value)
    except UnitError as exc:
        raise ConfigError(field_name, value, f"expected {exc.expected}") from None


def option(default: Any, help: str, *, unit: str | None = None,
           choices: tuple[str, ...] | None = None, minimum: float | None = None) -> Any:
    """A dataclass field for scheme options, with help text and how to parse it.

    ``unit`` is ``bytes``, ``rate`` (bytes/s) or ``seconds``; ``choices`` lists the
    allowed strings; ``minimum`` bounds numbers from below.
    """
    return field(default=default, metadata={"help": help, "unit": unit, "choices": choices,
                                            "minimum": minimum})


def parse_field(f: dataclasses.Field, value: Any, where: str) -> Any:
    """Convert ``value`` to the type of option field ``f``; :class:`ConfigError` if it
    does not fit."""
    meta = f.metadata
    unit = meta.get("unit")
    choices = meta.get("choices")
    minimum = meta.get("minimum")
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if unit == "bytes":
            out: Any = parse_size(value)
        elif unit == "rate":
            out = parse_rate(value)
        elif unit == "seconds":
            out = parse_time(value)
        elif typ == "bool":
            out = parse_bool(value, where)
        elif typ == "int":
            out = parse_int(value, where)
        elif typ == "float":
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if not math.isfinite(out):
                raise ValueError
        else:
            out = str(value)
    except UnitError as exc:
        raise ConfigError(where, value, f"expected {exc.expected}") from None
    except ValueError:
        raise ConfigError(where, value, f"expected {TYPE_WORDS.get(typ, typ)}") from None
    if choices is not None and out not in choices:
        raise ConfigError(where, value, f"choose one of: {', '.join(choices)}")
    if minimum is not None and out < minimum:
        raise ConfigError(where, value, f"must be at least {minimum:g}")
    return out


def parse_bool(value: Any, where: str) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case) or a bool."""
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ConfigError(where, value, "expected true or false")


def parse_int(value: Any, where: str) -> int:
    """An integer from an int, a whole float or a string (``ValueError`` otherwise)."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError
        return int(value)
    return int(str(value).strip())


def options_from_mapping(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    """An instance of options dataclass ``cls`` from a mapping of field name to value
    (strings or typed values). Unknown names raise :class:`ConfigError` listing the
    known ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            known = ", ".join(fields) or "(none)"
            raise ConfigError(f"{prefix}{key}", value, f"known: {known}", unknown=True)
        kwargs[key] = parse_field(fields[key], value, f"{prefix}{key}")
    return cls(**kwargs)


def describe_options(cls: type) -> list[tuple[str, Any, str]]:
    """``(name, default, help)`` of every field of an options dataclass."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulation needs.

    Attributes:
        trace: the model's layer trace (any batch size; rescaled to ``batch_size``).
        topology: a :class:`TopologySpec` (built inside the simulation, which lets a scheme
            add parameter-server hosts) or a ready :class:`Topology`.
        scheme: registry name of the training scheme (``dp``, ``ps``, ...).
        options: the scheme's options dataclass instance; ``None`` means its defaults.
        batch_size: samples per model replica per iteration (per GPU for data-parallel
            schemes, per pipeline for pipeline schemes); ``None`` keeps the trace's.
        iterations: measured iterations (after the warm-up ones).
        warmup_iterations: iterations simulated first and left out of the metrics.
        seed: seeds the random generator (used when ``compute_jitter > 0``).
        fidelity: ``detailed`` or ``analytic`` network model.
        chunk_bytes: message chunk size of the detailed network model.
        compute_jitter: coefficient of variation of each compute op's duration
            (log-normal, mean 1); 0 makes the run deterministic without a generator.
        compute_scale: throughput of the target GPU relative to the trace's device
            (2.0 halves every compute time).
        optimizer: ``sgd``, ``momentum`` or ``adam`` (memory and update time, see
            :data:`OPTIMIZERS`).
        record_spans: keep span records (needed for Chrome traces; metrics do not need
            them).
    """

    trace: Trace
    topology: TopologySpec | Topology
    scheme: str = "dp"
    options: Any = None
    batch_size: int | None = None
    iterations: int = 5
    warmup_iterations: int = 1
    seed: int = 0
    fidelity: str = "detailed"
    chunk_bytes: int = 1 << 20
    compute_jitter: float = 0.0
    compute_scale: float = 1.0
    optimizer: str = "momentum"
    record_spans: bool = True

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ConfigError("iterations", self.iterations, "must be at least 1")
        if self.warmup_iterations < 0:
            raise ConfigError("warmup_iterations", self.warmup_iterations, "must be >= 0")
        if self.fidelity not in FIDELITIES:
            raise ConfigError("fidelity", self.fidelity, f"choose one of: {', '.join(FIDELITIES)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError("batch_size", self.batch_size, "must be at least 1")
        if self.chunk_bytes < MIN_CHUNK_BYTES:
            raise ConfigError("chunk_bytes", self.chunk_bytes,
                              f"must be at least {MIN_CHUNK_BYTES} bytes (4KiB): smaller chunks "
                              "only multiply events")
        if not 0 <= self.compute_jitter < 10:
            raise ConfigError("compute_jitter", self.compute_jitter, "must be in [0, 10)")
        if not 0 < self.compute_scale < math.inf:
            raise ConfigError("compute_scale", self.compute_scale, "must be positive and finite")
        if self.seed < 0:
            raise ConfigError("seed", self.seed, "must be at least 0")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError("optimizer", self.optimizer,
                              f"choose one of: {', '.join(OPTIMIZERS)}")

    @property
    def gpus(self) -> int:
        """Number of GPUs."""
        t = self.topology
        return t.gpus if isinstance(t, TopologySpec) else t.num_gpus

    @property
    def effective_batch_size(self) -> int:
        """``batch_size``, or the trace's batch size when unset."""
        return self.batch_size or self.trace.meta.batch_size

    @property
    def total_iterations(self) -> int:
        """Warm-up plus measured iterations."""
        return self.warmup_iterations + self.iterations
