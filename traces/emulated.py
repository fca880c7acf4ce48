"""The layer trace an emulated device runs: a trace at a batch size, with its times
dilated and its bytes scaled down, and names every side can use.

An *emulated device* (:mod:`realrun.emudevice`) runs a model built from a layer trace:
one module per layer, whose forward and backward take the trace's times as timed waits
(no CPU), with parameters and outputs of the trace's sizes. Two factors let a small
machine run a large cluster (DieCast's time dilation, and its byte analogue):

* ``dilation`` K multiplies every compute time by K; the links are run at ``rate / K``;
  the run's times divided by K are the emulated cluster's;
* ``byte_scale`` B divides every parameter and activation size by B; the links are run at
  a further ``1 / B``, so every transfer still takes the time it would at full size.

:func:`emulated_trace` gives the trace of exactly what runs: times x K, sizes / B rounded
to whole float32 elements per sample (parameters: whole elements), layer names that are
Python identifiers, ``input`` layers first. The real model is built from that trace and
the simulator simulates that trace, so both move the same bytes, to the byte.

An emulated model is named by a reference (:func:`format_ref`) that carries all of this,
``emulated:resnet50;batch=32;dilation=10;bytes=4``, so every rank of a run, and every
process that resolves the job's model, builds the same one. No torch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from traces.model import Trace

PREFIX = "emulated:"
"""What an emulated model's reference starts with."""

ELEMENT_BYTES = 4
"""Bytes of one element of an emulated tensor (float32)."""


@dataclass(frozen=True)
class EmulatedSpec:
    """An emulated model.

    Attributes:
        trace: the trace's reference: a built-in trace name or a file path.
        batch_size: samples per worker per iteration (the trace is rescaled to it).
        dilation: compute times are multiplied by this (>= 1).
        byte_scale: parameter and activation sizes are divided by this (>= 1).
    """

    trace: str
    batch_size: int
    dilation: float = 1.0
    byte_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: {self.batch_size} is not allowed; need at least 1")
        if not self.dilation >= 1:
            raise ValueError(f"dilation: {self.dilation:g} is not allowed; need at least 1")
        if not self.byte_scale >= 1:
            raise ValueError(f"byte_scale: {self.byte_scale:g} is not allowed; need at least 1")
        if ";" in self.trace:
            raise ValueError(f"trace: {self.trace!r} is not allowed; a name without ';'")

    @property
    def rate_divisor(self) -> float:
        """What the emulated cluster's link rates are divided by: ``dilation * byte_scale``."""
        return self.dilation * self.byte_scale


def is_emulated_ref(ref: str) -> bool:
    """Whether ``ref`` names an emulated model."""
    return str(ref).startswith(PREFIX)


def format_ref(spec: EmulatedSpec) -> str:
    """The reference of ``spec`` (see module docs; :func:`parse_ref` reads it back)."""
    return (
        f"{PREFIX}{spec.trace};batch={spec.batch_size};"
        f"dilation={spec.dilation:g};bytes={spec.byte_scale:g}"
    )


def parse_ref(ref: str) -> EmulatedSpec:
    """The :class:`EmulatedSpec` of a reference written by :func:`format_ref`
    (``ValueError`` naming what is wrong)."""
    if not is_emulated_ref(ref):
        raise ValueError(f"model: {ref!r} is not an emulated model ({PREFIX}TRACE;...)")
    trace, *parts = ref[len(PREFIX) :].split(";")
    fields: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("batch", "dilation", "bytes"):
            raise ValueError(
                f"model: {ref!r}: {part!r} is not allowed; use batch=N, dilation=K, bytes=B"
            )
        fields[key] = value
    if "batch" not in fields:
        raise ValueError(f"model: {ref!r} names no batch=N")
    try:
        return EmulatedSpec(
            trace,
            int(fields["batch"]),
            float(fields.get("dilation", 1)),
            float(fields.get("bytes", 1)),
        )
    except ValueError as exc:
        raise ValueError(f"model: {ref!r}: {exc}") from None


def layer_name(name: str, used: set[str]) -> str:
    """A Python identifier for trace layer ``name`` (other characters become ``_``; a
    leading digit gets ``l``; ``_2``, ``_3``... when taken), added to ``used``."""
    base = re.sub(r"\W", "_", name) or "layer"
    if base[0].isdigit():
        base = "l" + base
    out, k = base, 2
    while out in used:
        out, k = f"{base}_{k}", k + 1
    used.add(out)
    return out


def per_sample_elements(nbytes: float, batch_size: int, byte_scale: float) -> int:
    """Float32 elements per sample of an activation of ``nbytes`` for the batch (at
    least one)."""
    return max(1, round(nbytes / byte_scale / ELEMENT_BYTES / batch_size))


def param_elements(nbytes: float, byte_scale: float) -> int:
    """Float32 elements of a layer's parameters of ``nbytes`` (0 stays 0; otherwise at
    least one)."""
    if nbytes <= 0:
        return 0
    return max(1, round(nbytes / byte_scale / ELEMENT_BYTES))


def emulated_trace(spec: EmulatedSpec, trace: Trace) -> Trace:
    """The trace an emulated device runs for ``spec`` (see module docs): ``trace`` at
    ``spec.batch_size``, times x dilation, sizes / byte scale in whole elements, layer
    names made identifiers, inputs first; edges and kinds unchanged, but for an edge from
    the first input to each layer without predecessors (which reads it)."""
    t = trace.rescale_batch(spec.batch_size)
    k, b, n = spec.dilation, spec.byte_scale, spec.batch_size
    used: set[str] = set()
    layers = []
    for layer in t.layers:
        layers.append(
            replace(
                layer,
                name=layer_name(layer.name, used),
                forward_s=layer.forward_s * k,
                backward_s=layer.backward_s * k,
                forward_fixed_s=layer.forward_fixed_s * k,
                backward_fixed_s=layer.backward_fixed_s * k,
                param_bytes=param_elements(layer.param_bytes, b) * ELEMENT_BYTES,
                activation_bytes=per_sample_elements(layer.activation_bytes, n, b)
                * ELEMENT_BYTES
                * n,
                flops=None if layer.flops is None else layer.flops / b,
            )
        )
    meta = replace(
        t.meta,
        model=f"{t.meta.model} (emulated)",
        provenance=(
            f"{t.meta.provenance} Emulated device: compute x{k:g}, bytes /{b:g} "
            f"(traces.emulated, {format_ref(spec)})."
        ).strip(),
    )
    # inputs first, as a traced module's placeholders come first (a topological order
    # still: an input has no predecessors)
    order = [i for i, lay in enumerate(layers) if lay.kind == "input"]
    order += [i for i, lay in enumerate(layers) if lay.kind != "input"]
    where = {old: new for new, old in enumerate(order)}
    edges = {(where[a], where[b]) for a, b in t.edges}
    # the emulated model's layer without predecessors reads the first input (it needs
    # the batch); the edge says so, so a pipeline carries that input to its stage in the
    # simulator as in the real run
    inputs = [i for i, lay in enumerate(layers) if lay.kind == "input"]
    if inputs:
        has_pred = {b for _, b in edges}
        edges |= {
            (0, where[i])
            for i, lay in enumerate(layers)
            if lay.kind != "input" and where[i] not in has_pred
        }
    return Trace(meta, tuple(layers[i] for i in order), tuple(sorted(edges)))


def load_run_trace(ref: str) -> Trace:
    """The trace an emulated model's reference ``ref`` runs (``ValueError`` for a bad
    reference; the trace catalogue's errors for a trace that cannot be read)."""
    from traces.catalog import load_trace

    spec = parse_ref(ref)
    return emulated_trace(spec, load_trace(spec.trace))
