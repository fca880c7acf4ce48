"""A layer's time as a function of the batch: a fixed part plus a part per sample.

A layer's forward or backward time on a batch of ``b`` samples is modelled as
``t(b) = fixed + per_sample * b``: the fixed part is what a call costs whatever its batch
(dispatch, kernel launches, allocation, the framework's own work), the rest grows with
the samples. Profiled at two or more batch sizes, each layer's line is fitted
(:func:`fit_batch_model`) and kept in the trace as :attr:`traces.model.Layer.forward_fixed_s`
and :attr:`~traces.model.Layer.backward_fixed_s`, so :meth:`traces.model.Trace.rescale_batch`
predicts another batch, or a pipeline's micro-batch, from one profile instead of scaling
every time in proportion (which makes small micro-batches too cheap).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from traces.model import Trace

__all__ = ["fit_batch_model", "fit_line_through"]


def fit_line_through(batches: Sequence[int], times_s: Sequence[float]) -> tuple[float, float]:
    """``(fixed_s, per_sample_s)``: the least-squares line through ``(batch, time)``
    points, kept physical: a negative slope (a time that fell as the batch grew, which
    only noise does) makes the whole mean time fixed, and a negative intercept makes all
    of it per sample (through the origin)."""
    n = len(batches)
    if n != len(times_s) or n < 2 or len(set(batches)) < 2:
        raise ValueError("need times at two or more different batch sizes")
    mb = sum(batches) / n
    mt = sum(times_s) / n
    sxx = sum((b - mb) ** 2 for b in batches)
    sxy = sum((b - mb) * (t - mt) for b, t in zip(batches, times_s, strict=True))
    slope = sxy / sxx
    if slope <= 0:
        return mt, 0.0
    fixed = mt - slope * mb
    if fixed < 0:  # through the origin: all of it per sample
        slope = sum(b * t for b, t in zip(batches, times_s, strict=True)) / sum(
            b * b for b in batches
        )
        return 0.0, slope
    return fixed, slope


def fit_batch_model(traces: Sequence[Trace]) -> Trace:
    """The trace at the largest batch of ``traces`` (profiles of one model at different
    batch sizes, layer for layer the same graph), each layer's fixed parts fitted over
    all of them (:func:`fit_line_through`) and capped at the layer's time at that batch.
    Its times are the largest batch's as measured; only the fixed parts are added.
    ``ValueError`` when the traces are not of one graph or share a batch size."""
    if len(traces) < 2:
        raise ValueError("need profiles at two or more batch sizes")
    batches = [t.meta.batch_size for t in traces]
    if len(set(batches)) != len(batches):
        raise ValueError(f"the batch sizes must differ, got {batches}")
    names = [tuple(layer.name for layer in t.layers) for t in traces]
    if any(n != names[0] for n in names[1:]):
        raise ValueError("the profiles are not of the same layers")
    top = max(range(len(traces)), key=lambda k: batches[k])
    base = traces[top]
    layers = []
    for i, layer in enumerate(base.layers):
        if layer.kind == "input":
            layers.append(layer)
            continue
        fwd, _ = fit_line_through(batches, [t.layers[i].forward_s for t in traces])
        bwd, _ = fit_line_through(batches, [t.layers[i].backward_s for t in traces])
        layers.append(
            replace(
                layer,
                forward_fixed_s=min(fwd, layer.forward_s),
                backward_fixed_s=min(bwd, layer.backward_s),
            )
        )
    sizes = ", ".join(str(b) for b in sorted(batches))
    provenance = base.meta.provenance
    provenance += ("; " if provenance else "") + f"fixed parts fitted over batches {sizes}"
    return Trace(replace(base.meta, provenance=provenance), tuple(layers), base.edges)
