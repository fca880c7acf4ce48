"""The layer-trace data model shared by the simulator and the real runs.

A :class:`Trace` is a directed acyclic graph of :class:`Layer` nodes, stored in a
topological (forward) order, plus :class:`TraceMeta` saying what was measured where.
All quantities are for the *whole profiled batch* (``meta.batch_size`` samples):
seconds for times, bytes for sizes, floating-point operations for FLOPs.

Rescaling (documented model, used by the simulator and by ``sim run --batch-size``):

* **Batch size** (:meth:`Trace.rescale_batch`): compute times, output activation bytes
  and FLOPs scale linearly with the number of samples; parameter bytes do not change.
  Linear scaling is exact for FLOPs and activations and a first-order model for time
  (small batches under-use a GPU, so it overestimates the time saved by shrinking).
* **Device** (:meth:`Trace.rescale_device`): every compute time is divided by a
  throughput ratio ``r`` (``r = 2`` means the target device runs the model twice as fast);
  sizes and FLOPs do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

LAYER_KINDS = ("layer", "input")
"""``input`` marks a data-loading node (PipeDream's ``Input``): its forward time is the
time to load a batch, which training overlaps with compute, so schemes do not run it."""


@dataclass(frozen=True)
class Layer:
    """One node of the layer graph.

    Attributes:
        name: unique name within the trace (``node12``, ``layer3.0.conv1``).
        op: the operator or module description (``Conv2d(3, 64, ...)``), free text.
        forward_s: forward compute time of the whole batch, seconds.
        backward_s: backward compute time of the whole batch, seconds.
        param_bytes: bytes of trainable parameters owned by the layer.
        activation_bytes: bytes of the layer's output activation for the whole batch.
        flops: forward floating-point operations for the whole batch, if known.
        kind: ``"layer"`` or ``"input"`` (see :data:`LAYER_KINDS`).
        forward_fixed_s: the part of ``forward_s`` that does not grow with the batch
            (the call's own cost: dispatch, launches, allocation), seconds; the rest is
            in proportion to the batch (:meth:`Trace.rescale_batch`). 0 when unknown:
            then all of it scales.
        backward_fixed_s: the same of ``backward_s``.
    """

    name: str
    forward_s: float
    backward_s: float
    param_bytes: int = 0
    activation_bytes: int = 0
    op: str = ""
    flops: float | None = None
    kind: str = "layer"
    forward_fixed_s: float = 0.0
    backward_fixed_s: float = 0.0

    def forward_share_s(self, share: float) -> float:
        """Forward seconds of ``share`` of the batch (a micro-batch: ``1/m``): the fixed
        part whole, the rest in proportion."""
        fixed = min(self.forward_fixed_s, self.forward_s)
        return fixed + (self.forward_s - fixed) * share

    def backward_share_s(self, share: float) -> float:
        """Backward seconds of ``share`` of the batch (see :meth:`forward_share_s`)."""
        fixed = min(self.backward_fixed_s, self.backward_s)
        return fixed + (self.backward_s - fixed) * share

    @property
    def compute_s(self) -> float:
        """Forward plus backward seconds (zero for input nodes, which are not run)."""
        return 0.0 if self.kind == "input" else self.forward_s + self.backward_s


@dataclass(frozen=True)
class TraceMeta:
    """What was measured, where and how.

    Attributes:
        model: model name (``resnet50``).
        device: device the times were measured on (``NVIDIA V100``, ``cpu``).
        batch_size: samples in the profiled batch; all per-batch quantities refer to it.
        dtype: element type of parameters and activations (``float32``).
        framework: framework and version that measured it (``PyTorch 2.13.0``).
        date: ISO date of the measurement, if known.
        provenance: free text: source, licence, method.
        source_format: the format the trace was read from (``dtsim``, ``pipedream``).
        peak_flop_per_s: for a trace computed from FLOP counts rather than measured
            (an *analytic* trace), the peak FLOP/s of the device it was computed for;
            0 for a measured trace. Older files have only a device named
            ``analytic:<FLOP/s>``; the rate is read from that name
            (:func:`legacy_analytic_peak`).
        cpu: the CPU model of the machine that measured it (``/proc/cpuinfo``'s "model
            name"), if recorded.
        cpu_cores: logical CPUs of that machine (0: not recorded).
        gpu: the GPU model it was measured on, for a trace measured on CUDA.
        machine: a fingerprint of that machine's hardware (CPU model, cores, memory,
            GPU; no host name), if recorded: equal fingerprints, same kind of machine.
        step_bytes_per_s: the optimizer step's rate over weight-sized memory passes,
            measured with the profile inside the training runtime (0: not measured);
            a calibrated preset of the same machine takes it as its
            ``gpu.memory_bandwidth_bytes_per_s``.
        step_overhead_s: the optimizer step's fixed cost measured with it (likewise
            ``gpu.step_overhead_s``).
    """

    model: str
    device: str
    batch_size: int
    dtype: str = "float32"
    framework: str = ""
    date: str = ""
    provenance: str = ""
    source_format: str = "dtsim"
    peak_flop_per_s: float = 0.0
    cpu: str = ""
    cpu_cores: int = 0
    gpu: str = ""
    machine: str = ""
    step_bytes_per_s: float = 0.0
    step_overhead_s: float = 0.0

    @property
    def measured_on(self) -> str:
        """The device the times come from, as precisely as recorded: the GPU model, else
        the CPU model for a trace measured on a CPU, else :attr:`device`."""
        if self.gpu:
            return self.gpu
        if self.cpu and self.device.lower() == "cpu":
            return self.cpu
        return self.device

    def __post_init__(self) -> None:
        if not self.peak_flop_per_s:
            object.__setattr__(self, "peak_flop_per_s", legacy_analytic_peak(self.device))


def legacy_analytic_peak(device: str) -> float:
    """The FLOP/s in an older analytic trace's device name ``analytic:<FLOP/s>`` (0 for any
    other name); only for reading files written before :attr:`TraceMeta.peak_flop_per_s`."""
    if not device.startswith("analytic:"):
        return 0.0
    try:
        peak = float(device.removeprefix("analytic:"))
    except ValueError:
        return 0.0
    return peak if peak > 0 and peak != float("inf") else 0.0


@dataclass(frozen=True)
class Trace:
    """A layer DAG with metadata.

    ``layers`` are in a topological order (every edge goes from a lower to a higher
    index); ``edges`` are ``(src_index, dst_index)`` pairs. The constructor checks both
    and raises ``ValueError`` naming the problem.
    """

    meta: TraceMeta
    layers: tuple[Layer, ...]
    edges: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("a trace needs at least one layer")
        if self.meta.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.meta.batch_size}")
        seen: set[str] = set()
        for i, layer in enumerate(self.layers):
            if layer.name in seen:
                raise ValueError(f"layer name {layer.name!r} appears twice")
            seen.add(layer.name)
            if layer.kind not in LAYER_KINDS:
                raise ValueError(f"layers[{i}].kind {layer.kind!r} is not one of {LAYER_KINDS}")
            for attr in ("forward_s", "backward_s", "param_bytes", "activation_bytes"):
                if getattr(layer, attr) < 0:
                    raise ValueError(f"layers[{i}].{attr} is negative")
        n = len(self.layers)
        for src, dst in self.edges:
            if not (0 <= src < n and 0 <= dst < n):
                raise ValueError(f"edge ({src}, {dst}) refers to a layer that does not exist")
            if src >= dst:
                raise ValueError(
                    f"edge {self.layers[src].name} -> {self.layers[dst].name} points backwards: "
                    "layers must be in topological order"
                )

    # ---- graph structure -------------------------------------------------------------
    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        """Direct successors of each layer, by index."""
        out: list[list[int]] = [[] for _ in self.layers]
        for s, d in self.edges:
            out[s].append(d)
        return tuple(tuple(sorted(set(x))) for x in out)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        """Direct predecessors of each layer, by index."""
        inc: list[list[int]] = [[] for _ in self.layers]
        for s, d in self.edges:
            inc[d].append(s)
        return tuple(tuple(sorted(set(x))) for x in inc)

    def index(self, name: str) -> int:
        """Index of the layer called ``name`` (``KeyError`` if absent)."""
        return self._index[name]

    @cached_property
    def _index(self) -> dict[str, int]:
        return {layer.name: i for i, layer in enumerate(self.layers)}

    # ---- totals ----------------------------------------------------------------------
    @cached_property
    def forward_s(self) -> float:
        """Total forward seconds of the layers that run (input nodes excluded)."""
        return sum(layer.forward_s for layer in self.layers if layer.kind != "input")

    @cached_property
    def backward_s(self) -> float:
        """Total backward seconds of the layers that run."""
        return sum(layer.backward_s for layer in self.layers if layer.kind != "input")

    @property
    def compute_s(self) -> float:
        """Forward plus backward seconds of one batch on the profiled device."""
        return self.forward_s + self.backward_s

    @cached_property
    def param_bytes(self) -> int:
        """Total parameter bytes."""
        return sum(layer.param_bytes for layer in self.layers)

    @cached_property
    def activation_bytes(self) -> int:
        """Sum of all layers' output activation bytes (what training keeps for backward)."""
        return sum(layer.activation_bytes for layer in self.layers if layer.kind != "input")

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of ``meta.dtype`` (4 for float32)."""
        return DTYPE_BYTES.get(self.meta.dtype, 4)

    @property
    def param_count(self) -> int:
        """Number of parameters (``param_bytes / dtype_bytes``)."""
        return self.param_bytes // self.dtype_bytes

    # ---- rescaling -------------------------------------------------------------------
    def rescale_batch(self, batch_size: int) -> Trace:
        """The same model at another batch size: activations, FLOPs and each time's
        per-sample part scale by ``batch_size / meta.batch_size``; a time's fixed part
        (:attr:`Layer.forward_fixed_s`, :attr:`Layer.backward_fixed_s`) and the
        parameters do not."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if batch_size == self.meta.batch_size:
            return self
        f = batch_size / self.meta.batch_size
        layers = tuple(
            replace(
                layer,
                forward_s=layer.forward_share_s(f),
                backward_s=layer.backward_share_s(f),
                activation_bytes=round(layer.activation_bytes * f),
                flops=None if layer.flops is None else layer.flops * f,
            )
            for layer in self.layers
        )
        return Trace(replace(self.meta, batch_size=batch_size), layers, self.edges)

    def rescale_device(self, throughput_ratio: float, device: str | None = None) -> Trace:
        """The same model on a device ``throughput_ratio`` times faster: every compute time
        is divided by the ratio. ``device`` renames ``meta.device``."""
        if not throughput_ratio > 0:
            raise ValueError(f"throughput_ratio must be positive, got {throughput_ratio}")
        if throughput_ratio == 1 and device is None:
            return self
        layers = tuple(
            replace(
                layer,
                forward_s=layer.forward_s / throughput_ratio,
                backward_s=layer.backward_s / throughput_ratio,
                forward_fixed_s=layer.forward_fixed_s / throughput_ratio,
                backward_fixed_s=layer.backward_fixed_s / throughput_ratio,
            )
            for layer in self.layers
        )
        meta = replace(self.meta, device=device if device is not None else self.meta.device)
        return Trace(meta, layers, self.edges)


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
"""Bytes per element of the dtypes a trace may declare."""


def chain(meta: TraceMeta, layers: list[Layer]) -> Trace:
    """A trace whose layers form a straight chain, in the given order (handy in tests
    and for sequential models)."""
    return Trace(meta, tuple(layers), tuple((i, i + 1) for i in range(len(layers) - 1)))
