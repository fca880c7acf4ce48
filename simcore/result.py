"""The immutable result of one simulation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from simcore.records import Span

CONTRACT_KEYS = (
    "scheme", "gpus", "model", "topology", "batch_size", "iterations", "iteration_time_s",
    "throughput_samples_s", "speedup", "gpu_utilization", "per_gpu_utilization",
    "bubble_fraction", "comm_bytes_total", "comm_bytes_by_link_kind", "peak_memory_bytes",
    "events", "wall_s",
)
"""Keys every ``sim run --json`` object carries (docs/architecture.md); more are added."""


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class RunResult:
    """Metrics of one run plus its span records.

    Times in seconds, sizes in bytes, rates in samples/s. ``spans`` holds raw tuples in
    :class:`~simcore.records.Span` field order (see :meth:`span_records`).
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
    events: int
    model_events: int
    wall_s: float
    simulated_s: float
    messages: int
    gpu_model: str
    trace_device: str
    compute_scale: float
    device_names: tuple[str, ...]
    spans: tuple[tuple[Any, ...], ...] = field(repr=False, default=())
    extra: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))

    @property
    def fits_in_memory(self) -> bool:
        """Whether every GPU's peak stays within its capacity."""
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def span_records(self) -> list[Span]:
        """The spans as :class:`~simcore.records.Span` named tuples."""
        return [Span._make(s) for s in self.spans]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: every key of :data:`CONTRACT_KEYS` and more."""
        d = {
            "scheme": self.scheme, "gpus": self.gpus, "model": self.model,
            "topology": self.topology, "fidelity": self.fidelity,
            "batch_size": self.batch_size, "global_batch_size": self.global_batch_size,
            "iterations": self.iterations, "warmup_iterations": self.warmup_iterations,
            "iteration_time_s": self.iteration_time_s,
            "iteration_times_s": list(self.iteration_times_s),
            "throughput_samples_s": self.throughput_samples_s,
            "single_gpu_time_s": self.single_gpu_time_s, "speedup": self.speedup,
            "gpu_utilization": self.gpu_utilization,
            "per_gpu_utilization": list(self.per_gpu_utilization),
            "bubble_fraction": self.bubble_fraction,
            "comm_bytes_total": self.comm_bytes_total,
            "comm_bytes_per_iteration": self.comm_bytes_per_iteration,
            "simulated_iterations": self.simulated_iterations,
            "comm_bytes_by_link_kind": dict(self.comm_bytes_by_link_kind),
            "comm_bytes_by_link": dict(self.comm_bytes_by_link),
            "link_utilization": dict(self.link_utilization),
            "peak_memory_bytes": self.peak_memory_bytes,
            "per_gpu_peak_memory_bytes": list(self.per_gpu_peak_memory_bytes),
            "memory_breakdown_bytes": dict(self.memory_breakdown_bytes),
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_in_memory": self.fits_in_memory,
            "gpu_model": self.gpu_model, "trace_device": self.trace_device,
            "compute_scale": self.compute_scale,
            "events": self.events, "model_events": self.model_events,
            "messages": self.messages,
            "simulated_s": self.simulated_s, "wall_s": self.wall_s,
        }
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d
