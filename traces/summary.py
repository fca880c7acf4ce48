"""Summaries and views of a trace: totals, the biggest layers, a timeline.

Pure functions of a :class:`~traces.model.Trace`; the command line formats the results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traces.model import Trace


@dataclass(frozen=True)
class LayerShare:
    """One layer in a ranking: its name, operator, the ranked quantity and its share."""

    name: str
    op: str
    value: float
    fraction: float


@dataclass(frozen=True)
class TraceSummary:
    """What ``sim trace show`` prints.

    Attributes:
        layers: layers that run (input nodes excluded).
        inputs: input (data-loading) nodes.
        edges: data dependencies.
        joins: layers reading from more than one layer.
        forward_s, backward_s: total compute seconds of one batch.
        param_bytes, param_count: trainable parameters.
        activation_bytes: sum of the layers' output activations for the batch.
        flops: forward FLOPs of the batch, ``None`` when no layer records them.
        by_time: the biggest layers by forward + backward seconds.
        by_params: the biggest layers by parameter bytes.
    """

    layers: int
    inputs: int
    edges: int
    joins: int
    forward_s: float
    backward_s: float
    param_bytes: int
    param_count: int
    activation_bytes: int
    flops: float | None
    by_time: tuple[LayerShare, ...]
    by_params: tuple[LayerShare, ...]


def summarize(trace: Trace, top: int = 5) -> TraceSummary:
    """Totals of ``trace`` and its ``top`` biggest layers by time and by parameters."""
    running = [layer for layer in trace.layers if layer.kind != "input"]
    known = [layer.flops for layer in running if layer.flops is not None]

    def ranking(key: Any) -> tuple[LayerShare, ...]:
        total = sum(key(layer) for layer in running) or 1.0
        ranked = sorted(running, key=lambda layer: -key(layer))[:top]
        return tuple(
            LayerShare(layer.name, layer.op, float(key(layer)), key(layer) / total)
            for layer in ranked
            if key(layer) > 0
        )

    return TraceSummary(
        layers=len(running),
        inputs=len(trace.layers) - len(running),
        edges=len(trace.edges),
        joins=sum(1 for preds in trace.predecessors if len(preds) > 1),
        forward_s=trace.forward_s,
        backward_s=trace.backward_s,
        param_bytes=trace.param_bytes,
        param_count=trace.param_count,
        activation_bytes=trace.activation_bytes,
        flops=sum(known) if known else None,
        by_time=ranking(lambda layer: layer.compute_s),
        by_params=ranking(lambda layer: layer.param_bytes),
    )


def to_chrome(trace: Trace) -> dict[str, Any]:
    """A Chrome trace (Perfetto, chrome://tracing) of one training step on one device:
    every layer's forward in order, then the backward in reverse order."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": trace.meta.device}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}},
    ]
    t_us = 0.0
    running = [layer for layer in trace.layers if layer.kind != "input"]
    steps = [(layer, "forward", layer.forward_s) for layer in running]
    steps += [(layer, "backward", layer.backward_s) for layer in reversed(running)]
    for layer, phase, seconds in steps:
        events.append(
            {
                "ph": "X",
                "pid": 0,
                "tid": 0,
                "name": layer.name,
                "cat": phase,
                "ts": t_us,
                "dur": seconds * 1e6,
                "args": {
                    "op": layer.op,
                    "param_bytes": layer.param_bytes,
                    "activation_bytes": layer.activation_bytes,
                    "flops": layer.flops,
                },
            }
        )
        t_us += seconds * 1e6
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": trace.meta.model,
            "batch_size": trace.meta.batch_size,
            "device": trace.meta.device,
        },
    }
