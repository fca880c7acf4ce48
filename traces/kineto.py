"""Importer for PyTorch profiler (Kineto) traces: the JSON ``export_chrome_trace`` writes.

The convention (what :mod:`realrun.kineto` records, and what any other recorder must do):

* **Forward**: each layer's forward runs inside a ``torch.profiler.record_function`` range
  named ``layer::<name>`` (:data:`RANGE_PREFIX`). Nested ranges are allowed; an op belongs
  to the innermost one. A layer's forward time is the total duration of its ranges divided
  by the number of profiled steps.
* **Backward**: autograd does not carry ranges into backward, so the backward counterpart of
  a layer is found by *sequence number*: every forward op that autograd records has a
  ``Sequence number``, and the backward function it creates runs as an
  ``autograd::engine::evaluate_function: ...Backward`` event with the same number. Those
  events' durations are the layer's backward time; an ``AccumulateGrad`` event (no sequence
  number) belongs to the layer whose backward ran just before it on the same thread.
  Backward work of ops outside every range (the loss) is left out and reported in the
  provenance.
* **GPU**: when the trace holds GPU kernels, times are the kernels' durations instead, each
  kernel charged to the layer (forward or backward) whose CPU event launched it (matched by
  the ``correlation`` id of the launch).
* **Steps**: the number of ``ProfilerStep#N`` ranges (else the number of times the first
  layer's range occurs); all times are per step.
* **Structure**: a top-level ``"dtsim"`` object (:data:`METADATA_KEY`, added with
  ``prof.add_metadata_json``) gives the layer graph: ``model``, ``batch_size``, ``dtype``,
  ``device``, ``framework``, ``date``, ``layers`` (``name``, ``op``, ``kind``,
  ``param_bytes``, ``activation_bytes``, ``flops``) and ``edges`` (``[src, dst]`` names).
  Without it the layers are the ranges in order of first appearance, joined in a chain, with
  unknown sizes, and the batch size must be given.

Pure JSON: this module does not import torch.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

from traces.errors import TraceFormatError
from traces.jsonfmt import read_json
from traces.model import LAYER_KINDS, Layer, Trace, TraceMeta
from traces.toposort import sort_layers

RANGE_PREFIX = "layer::"
"""Prefix of the ``record_function`` range of a layer's forward."""

METADATA_KEY = "dtsim"
"""Top-level key of the layer-graph metadata in a Kineto trace."""

_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_ACCUMULATE = "AccumulateGrad"
_STEP_PREFIX = "ProfilerStep#"
_KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_SLACK_US = 0.01  # rounding of event times: a child may seem to end this much late


def load(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Trace:
    """Read a Kineto JSON trace file into a :class:`Trace` (see the module docs).

    ``model``, ``batch_size`` and ``device`` override the metadata; ``batch_size`` is
    required when the trace has no ``"dtsim"`` metadata.
    """
    src = os.fspath(path)
    return from_dict(read_json(src), source=src, model=model, batch_size=batch_size, device=device)


def is_kineto(data: Any) -> bool:
    """Whether a parsed JSON document looks like a Kineto / Chrome trace."""
    return isinstance(data, dict) and "traceEvents" in data


@dataclass(frozen=True)
class _Event:
    """A complete (``"ph": "X"``) event, times in microseconds."""

    index: int
    name: str
    cat: str
    thread: tuple[Any, Any]
    ts: float
    end: float
    args: dict[str, Any]


def from_dict(
    data: Any,
    *,
    source: str = "<kineto>",
    model: str | None = None,
    batch_size: int | None = None,
    device: str | None = None,
) -> Trace:
    """Build a trace from a parsed Kineto JSON document (see :func:`load`)."""
    if not is_kineto(data):
        raise TraceFormatError(
            source, "traceEvents", "missing: not a PyTorch profiler (Kineto) trace"
        )
    events = _complete_events(data["traceEvents"], source)
    graph = _metadata(data, source)
    ranges = [e for e in events if e.name.startswith(RANGE_PREFIX)]
    if not ranges:
        raise TraceFormatError(
            source, "traceEvents", f"no '{RANGE_PREFIX}<layer>' record_function ranges found"
        )
    steps = sum(1 for e in events if e.name.startswith(_STEP_PREFIX))
    if steps == 0:
        first = ranges[0].name
        steps = sum(1 for e in ranges if e.name == first)

    bwd_owner, unattributed_us = _attribute(events, ranges)
    kernels = [e for e in events if e.cat in _KERNEL_CATS]
    fwd_us: dict[str, float] = {}
    bwd_us: dict[str, float] = {}
    if kernels:
        launch_owner = _launch_owners(events, ranges, bwd_owner)
        for k in kernels:
            owner = launch_owner.get(k.args.get("correlation"))
            if owner is not None:
                table = fwd_us if owner[1] == "forward" else bwd_us
                table[owner[0]] = table.get(owner[0], 0.0) + (k.end - k.ts)
    else:
        for r in ranges:
            layer = r.name[len(RANGE_PREFIX) :]
            fwd_us[layer] = fwd_us.get(layer, 0.0) + (r.end - r.ts)
        for e in events:
            if e.index in bwd_owner:
                layer = bwd_owner[e.index]
                bwd_us[layer] = bwd_us.get(layer, 0.0) + (e.end - e.ts)

    order = list(dict.fromkeys(r.name[len(RANGE_PREFIX) :] for r in ranges))
    if graph is None:
        if batch_size is None:
            raise TraceFormatError(
                source,
                METADATA_KEY,
                "the trace has no layer-graph "
                "metadata, so the batch size is "
                "unknown; pass it explicitly",
            )
        specs = [{"name": n, "kind": "layer"} for n in order]
        edges = list(itertools.pairwise(order))
        graph = {"layers": specs, "edges": edges, "model": "", "batch_size": batch_size}
    else:
        known = {spec["name"] for spec in graph["layers"]}
        stray = [n for n in order if n not in known]
        if stray:
            raise TraceFormatError(
                source,
                f"{METADATA_KEY}.layers",
                f"range '{RANGE_PREFIX}{stray[0]}' names no layer of the metadata",
            )
    layers: list[Layer] = []
    for i, spec in enumerate(graph["layers"]):
        name = spec["name"]
        if spec["kind"] == "layer" and name not in fwd_us and not kernels:
            raise TraceFormatError(
                source,
                f"{METADATA_KEY}.layers[{i}]",
                f"layer {name!r} has no '{RANGE_PREFIX}{name}' range",
            )
        layers.append(
            Layer(
                name=name,
                op=spec.get("op", ""),
                kind=spec["kind"],
                forward_s=fwd_us.get(name, 0.0) / steps / 1e6,
                backward_s=bwd_us.get(name, 0.0) / steps / 1e6,
                param_bytes=spec.get("param_bytes", 0),
                activation_bytes=spec.get("activation_bytes", 0),
                flops=spec.get("flops"),
            )
        )
    dev = device or graph.get("device") or ("cuda" if kernels else "cpu")
    timing = "GPU kernel durations" if kernels else "CPU event durations"
    meta = TraceMeta(
        model=model or graph.get("model") or os.path.splitext(os.path.basename(source))[0],
        device=dev,
        batch_size=batch_size or graph["batch_size"],
        dtype=graph.get("dtype", "float32"),
        framework=graph.get("framework", "PyTorch"),
        date=graph.get("date", ""),
        provenance=(
            f"imported from the PyTorch profiler (Kineto) trace "
            f"{os.path.basename(source)}: {steps} profiled step(s), {timing}; forward "
            f"from '{RANGE_PREFIX}' ranges, backward from autograd functions matched "
            f"by sequence number; {unattributed_us / steps / 1e3:.3f} ms of backward "
            f"work per step outside every layer (e.g. the loss) left out"
        ),
        source_format="kineto",
    )
    try:
        return sort_layers(meta, layers, [tuple(e) for e in graph["edges"]])
    except ValueError as exc:
        raise TraceFormatError(source, f"{METADATA_KEY}.edges", str(exc)) from None


# ---- reading and checking ----------------------------------------------------------------


def _complete_events(raw: Any, source: str) -> list[_Event]:
    if not isinstance(raw, list):
        raise TraceFormatError(source, "traceEvents", "expected a list of events")
    out: list[_Event] = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise TraceFormatError(source, f"traceEvents[{i}]", "expected an object")
        if e.get("ph") != "X":
            continue
        for key in ("ts", "dur"):
            val = e.get(key)
            if (
                isinstance(val, bool)
                or not isinstance(val, int | float)
                or not math.isfinite(val)
                or (key == "dur" and val < 0)
            ):
                raise TraceFormatError(
                    source,
                    f"traceEvents[{i}].{key}",
                    f"expected a {'non-negative ' if key == 'dur' else ''}number, got {val!r}",
                )
        name = e.get("name")
        if not isinstance(name, str):
            raise TraceFormatError(
                source, f"traceEvents[{i}].name", f"expected a string, got {name!r}"
            )
        args = e.get("args", {})
        if not isinstance(args, dict):
            raise TraceFormatError(source, f"traceEvents[{i}].args", "expected an object")
        out.append(
            _Event(
                i,
                name,
                str(e.get("cat", "")),
                (e.get("pid"), e.get("tid")),
                float(e["ts"]),
                float(e["ts"]) + float(e["dur"]),
                args,
            )
        )
    return out


def _metadata(data: dict[str, Any], source: str) -> dict[str, Any] | None:
    g = data.get(METADATA_KEY)
    if g is None:
        return None
    where = METADATA_KEY

    def fail(field: str, problem: str) -> None:
        raise TraceFormatError(source, f"{where}{field}", problem)

    if not isinstance(g, dict):
        fail("", "expected an object")
    b = g.get("batch_size")
    if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
        fail(".batch_size", f"expected a positive integer, got {b!r}")
    layers = g.get("layers")
    if not isinstance(layers, list) or not layers:
        fail(".layers", "expected a non-empty list of layer objects")
    for i, spec in enumerate(layers):
        at = f".layers[{i}]"
        if not isinstance(spec, dict):
            fail(at, "expected an object")
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            fail(f"{at}.name", f"expected a non-empty string, got {spec.get('name')!r}")
        spec.setdefault("kind", "layer")
        if spec["kind"] not in LAYER_KINDS:
            fail(f"{at}.kind", f"expected one of {', '.join(LAYER_KINDS)}, got {spec['kind']!r}")
        for key in ("param_bytes", "activation_bytes"):
            v = spec.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                fail(f"{at}.{key}", f"expected an integer >= 0, got {v!r}")
        f = spec.get("flops")
        if f is not None and (isinstance(f, bool) or not isinstance(f, int | float) or f < 0):
            fail(f"{at}.flops", f"expected a non-negative number or null, got {f!r}")
    names = [spec["name"] for spec in layers]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        fail(".layers", f"duplicate layer name {dup!r}")
    edges = g.get("edges", [])
    if not isinstance(edges, list):
        fail(".edges", "expected a list of [src, dst] name pairs")
    for i, e in enumerate(edges):
        if not (isinstance(e, list) and len(e) == 2 and all(x in names for x in e)):
            fail(f".edges[{i}]", f"expected a [src, dst] pair of layer names, got {e!r}")
    return g


# ---- attribution -------------------------------------------------------------------------


def _innermost(intervals: list[_Event], points: list[_Event]) -> dict[int, _Event]:
    """For each point event, the innermost interval on the same thread that contains it
    (events on one thread nest properly, so a sweep with a stack finds it)."""
    out: dict[int, _Event] = {}
    by_thread: dict[tuple[Any, Any], list[_Event]] = {}
    for iv in intervals:
        by_thread.setdefault(iv.thread, []).append(iv)
    for thread, ivs in by_thread.items():
        ivs.sort(key=lambda e: (e.ts, -e.end))
        stack: list[_Event] = []
        j = 0
        for p in sorted((p for p in points if p.thread == thread), key=lambda e: e.ts):
            while j < len(ivs) and ivs[j].ts <= p.ts:
                while stack and stack[-1].end <= ivs[j].ts:
                    stack.pop()
                stack.append(ivs[j])
                j += 1
            while stack and stack[-1].end + _SLACK_US < p.end:
                stack.pop()
            if stack:
                out[p.index] = stack[-1]
    return out


def _attribute(events: list[_Event], ranges: list[_Event]) -> tuple[dict[int, str], float]:
    """Backward functions (by event index) -> layer names, and the microseconds of
    backward functions that belong to no layer."""
    seq_ops = [
        e
        for e in events
        if "Sequence number" in e.args
        and not e.name.startswith(_BACKWARD_PREFIX)
        and e.cat != "user_annotation"
    ]
    owner = _innermost(ranges, seq_ops)
    seq_layer: dict[tuple[Any, Any], str] = {}
    for op in seq_ops:
        if op.index in owner:
            layer = owner[op.index].name[len(RANGE_PREFIX) :]
            seq_layer.setdefault((op.thread[0], op.args["Sequence number"]), layer)
    bwd_owner: dict[int, str] = {}
    unattributed = 0.0
    last: dict[tuple[Any, Any], str] = {}
    backward = sorted(
        (e for e in events if e.name.startswith(_BACKWARD_PREFIX)), key=lambda e: e.ts
    )
    for e in backward:
        layer: str | None
        if _ACCUMULATE in e.name:
            layer = last.get(e.thread)
        else:
            layer = seq_layer.get((e.thread[0], e.args.get("Sequence number")))
            if layer is not None:
                last[e.thread] = layer
        if layer is None:
            unattributed += e.end - e.ts
        else:
            bwd_owner[e.index] = layer
    return bwd_owner, unattributed


def _launch_owners(
    events: list[_Event], ranges: list[_Event], bwd_owner: dict[int, str]
) -> dict[Any, tuple[str, str]]:
    """Correlation id of each kernel launch -> (layer, "forward" | "backward")."""
    launches = [e for e in events if e.cat == "cuda_runtime" and "correlation" in e.args]
    bwd_events = [e for e in events if e.index in bwd_owner]
    fwd_in = _innermost(ranges, launches)
    bwd_in = _innermost(bwd_events, launches)
    out: dict[Any, tuple[str, str]] = {}
    for launch in launches:
        corr = launch.args["correlation"]
        if launch.index in bwd_in:
            out[corr] = (bwd_owner[bwd_in[launch.index].index], "backward")
        elif launch.index in fwd_in:
            out[corr] = (fwd_in[launch.index].name[len(RANGE_PREFIX) :], "forward")
    return out
