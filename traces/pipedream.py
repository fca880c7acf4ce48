"""Importer for PipeDream's profiler output (``graph.txt``).

One line per node, then one tab-indented line per edge::

    node4 -- Conv2d(64, 64, ...) -- forward_compute_time=46.201, \
        backward_compute_time=113.330, activation_size=1644167168.000, parameter_size=147712.000

(one line in the file; wrapped here)
    \tnode1 -- node2

Times are milliseconds for the whole profiled batch; sizes are bytes. A node with several
outputs lists its activation sizes as ``[a; b; c]``; the importer sums them. Nodes whose
description starts with ``Input`` are data-loading nodes (``kind="input"``).

graph.txt does not record the batch size. For image models it is recovered from the input
node's activation size (``batch = input_bytes / (3 * H * W * 4)`` for 224 or 299 pixel
inputs); otherwise the caller must pass it.
"""

from __future__ import annotations

import os
import re

from traces.errors import TraceFormatError, unreadable
from traces.model import Layer, Trace, TraceMeta
from traces.toposort import sort_layers

_NODE_ID = re.compile(r"^node\d+$")
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_IMAGE_SIDES = (224, 299)


def load(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    batch_size: int | None = None,
    device: str = "unknown GPU",
    provenance: str = "",
    framework: str = "PyTorch (PipeDream profiler)",
) -> Trace:
    """Read a PipeDream ``graph.txt`` file into a :class:`Trace`.

    ``model`` defaults to the file's stem; ``batch_size`` defaults to the value inferred
    from an image input node (a :class:`TraceFormatError` if it cannot be inferred).
    """
    src = os.fspath(path)
    try:
        with open(src, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(src, "", unreadable(exc)) from None
    name = model or os.path.splitext(os.path.basename(src))[0]
    return parse(
        text,
        source=src,
        model=name,
        batch_size=batch_size,
        device=device,
        provenance=provenance,
        framework=framework,
    )


def parse(
    text: str,
    *,
    source: str = "<graph.txt>",
    model: str = "model",
    batch_size: int | None = None,
    device: str = "unknown GPU",
    provenance: str = "",
    framework: str = "PyTorch (PipeDream profiler)",
) -> Trace:
    """Parse the text of a ``graph.txt`` file (see :func:`load`)."""
    layers: list[Layer] = []
    seen: dict[str, int] = {}
    edges: list[tuple[str, str]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"line {lineno}"
        if raw[0] in " \t":
            parts = [p.strip() for p in raw.strip().split(" -- ")]
            if len(parts) != 2 or not all(_NODE_ID.match(p) for p in parts):
                raise TraceFormatError(
                    source, where, f"expected an edge 'nodeA -- nodeB', got {raw.strip()!r}"
                )
            edges.append((parts[0], parts[1]))
            continue
        parts = raw.split(" -- ")
        if len(parts) < 3 or not _NODE_ID.match(parts[0].strip()):
            raise TraceFormatError(
                source, where, "expected 'nodeN -- description -- forward_compute_time=..., ...'"
            )
        node = parts[0].strip()
        desc = " -- ".join(parts[1:-1]).strip()
        values = _parse_fields(parts[-1], source, where)
        if node in seen:
            # PipeDream repeats a node line next to its edges; it must agree with the first.
            prev = layers[seen[node]]
            if prev.op != desc:
                raise TraceFormatError(source, where, f"{node} described twice differently")
            continue
        seen[node] = len(layers)
        layers.append(
            Layer(
                name=node,
                op=desc,
                kind="input" if desc.startswith("Input") else "layer",
                forward_s=values["forward_compute_time"] / 1e3,
                backward_s=values["backward_compute_time"] / 1e3,
                activation_bytes=round(values["activation_size"]),
                param_bytes=round(values["parameter_size"]),
            )
        )
    if not layers:
        raise TraceFormatError(source, "", "no node lines found")
    for i, (s, d) in enumerate(edges):
        for x in (s, d):
            if x not in seen:
                raise TraceFormatError(source, f"edge {i} ({s} -- {d})", f"{x} has no node line")
    if batch_size is None:
        batch_size = infer_image_batch(layers)
        if batch_size is None:
            raise TraceFormatError(
                source,
                "batch size",
                "graph.txt does not record the batch "
                "size and it cannot be inferred from "
                "an image input; pass it explicitly",
            )
    meta = TraceMeta(
        model=model,
        device=device,
        batch_size=batch_size,
        dtype="float32",
        framework=framework,
        provenance=provenance,
        source_format="pipedream",
    )
    try:
        return sort_layers(meta, layers, edges)
    except ValueError as exc:
        raise TraceFormatError(source, "edges", str(exc)) from None


def infer_image_batch(layers: list[Layer]) -> int | None:
    """Batch size implied by the first input node's activation bytes, if it is a whole
    number of fp32 3x224x224 or 3x299x299 images."""
    for layer in layers:
        if layer.kind == "input" and layer.activation_bytes > 0:
            for side in _IMAGE_SIDES:
                per_sample = 3 * side * side * 4
                b, rem = divmod(layer.activation_bytes, per_sample)
                if rem == 0 and b > 0:
                    return b
            return None
    return None


def _parse_fields(text: str, source: str, where: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for item in text.split(", "):
        key, sep, val = item.strip().partition("=")
        if not sep:
            raise TraceFormatError(source, where, f"expected key=value, got {item.strip()!r}")
        try:
            if val.startswith("["):
                values[key] = sum(float(x) for x in val.strip("[]").split(";") if x.strip())
            else:
                values[key] = float(val)
        except ValueError:
            raise TraceFormatError(
                source, f"{where}: {key}", f"expected a number, got {val!r}"
            ) from None
    for key in _FIELDS:
        if key not in values:
            raise TraceFormatError(source, f"{where}: {key}", "missing")
        if values[key] < 0:
            raise TraceFormatError(source, f"{where}: {key}", f"negative value {values[key]}")
    return values
