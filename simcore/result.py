"""The immutable result of one simulation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from simcore.records import Span

CONTRACT_KEYS = (
    "scheme",
    "gpus",
    "model",
    "topology",
    "batch_size",
    "iterations",
    "iteration_time_s",
    "throughput_samples_s",
    "speedup",
    "gpu_utilization",
    "per_gpu_utilization",
    "bubble_fraction",
    "comm_bytes_total",
    "comm_bytes_by_link_kind",
    "peak_memory_bytes",
    "events",
    "wall_s",
)
"""Keys every ``sim run --json`` object carries (docs/architecture.md); more are added."""


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _jsonable(value: Any) -> Any:
    """A field's value as plain JSON data: mappings as dicts, tuples as lists."""
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class RunResult:
    """Metrics of one run plus its span records.

    Times in seconds, sizes in bytes, rates in samples/s. ``spans`` holds raw tuples in
    :class:`~simcore.records.Span` field order (see :meth:`span_records`).

    Totals say what they cover: ``comm_bytes_total`` and the per-link and per-kind byte
    counters cover the whole run, warm-up iterations (and a pipeline's lead and tail)
    included; ``comm_bytes_measured`` covers the measured iterations only and
    ``comm_bytes_per_iteration`` is it over ``iterations``. See :mod:`simcore.metrics`.

    :meth:`to_dict` (the ``--json`` object) is every field but ``spans``, in this order,
    followed by the scheme's ``extra`` metrics: a new field is in the JSON at once.
    """

    scheme: str
    gpus: int
    model: str
    topology: str
    fidelity: str
    batch_size: int
    global_batch_size: int
    iterations: int
    warmup_iterations: int
    iteration_time_s: float
    iteration_times_s: tuple[float, ...]
    throughput_samples_s: float
    single_gpu_time_s: float
    speedup: float
    gpu_utilization: float
    per_gpu_utilization: tuple[float, ...]
    bubble_fraction: float
    comm_bytes_total: int
    comm_bytes_measured: int
    comm_bytes_per_iteration: float
    simulated_iterations: int
    comm_bytes_by_link_kind: Mapping[str, int]
    comm_bytes_by_link: Mapping[str, int]
    comm_bytes_received_by_link: Mapping[str, int]
    link_utilization: Mapping[str, float]
    peak_memory_bytes: int
    per_gpu_peak_memory_bytes: tuple[int, ...]
    memory_breakdown_bytes: Mapping[str, int]
    memory_capacity_bytes: int
    fits_in_memory: bool = field(init=False)
    """Whether every GPU's peak stays within its capacity."""
    gpu_model: str
    device_kind: str
    """``gpu``, or ``cpu`` for ranks on CPU hosts (the per-GPU fields then describe the
    ranks' CPUs)."""
    trace_device: str
    compute_scale: float
    device_names: tuple[str, ...]
    events: int
    model_events: int
    messages: int
    simulated_s: float
    wall_s: float
    spans: tuple[tuple[Any, ...], ...] = field(repr=False, default=(), metadata={"json": False})
    extra: Mapping[str, Any] = field(default_factory=lambda: _frozen({}), metadata={"json": False})

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "fits_in_memory", self.peak_memory_bytes <= self.memory_capacity_bytes
        )

    def span_records(self) -> list[Span]:
        """The spans as :class:`~simcore.records.Span` named tuples."""
        return [Span._make(s) for s in self.spans]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: every field but the span records (mappings as dicts,
        tuples as lists), then the scheme's extra metrics; it has every key of
        :data:`CONTRACT_KEYS`."""
        d = {
            f.name: _jsonable(getattr(self, f.name))
            for f in fields(self)
            if f.metadata.get("json", True)
        }
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d
