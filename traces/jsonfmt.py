"""dtsim's own trace format: versioned JSON.

Schema (version 1)::

    {
      "format": "dtsim-trace",
      "version": 1,
      "meta": {"model": str, "device": str, "batch_size": int > 0,
               "dtype": str, "framework": str, "date": str, "provenance": str,
               "peak_flop_per_s": number, "cpu": str, "cpu_cores": int, "gpu": str,
               "machine": str},
      "layers": [{"name": str, "forward_s": number >= 0, "backward_s": number >= 0,
                  "param_bytes": int >= 0, "activation_bytes": int >= 0,
                  "op": str, "flops": number | null, "kind": "layer" | "input",
                  "forward_fixed_s": number >= 0, "backward_fixed_s": number >= 0}, ...],
      "edges": [[src_name, dst_name], ...]
    }

``layers`` may come in any order; the loader sorts them topologically (keeping the file's
order where the graph allows). Only ``meta.model``, ``meta.device``, ``meta.batch_size``
and each layer's ``name``, ``forward_s`` and ``backward_s`` are required; the fields saying
where a trace was measured (``cpu``, ``cpu_cores``, ``gpu``, ``machine``; ``date`` an ISO
date or date-time) are written only when known, so older files load unchanged. So are a
layer's ``forward_fixed_s`` and ``backward_fixed_s`` (the part of its times that does not
grow with the batch, :attr:`traces.model.Layer.forward_fixed_s`; at most the time itself).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from traces.atomic import write_text
from traces.errors import TraceFormatError, unreadable
from traces.model import LAYER_KINDS, Layer, Trace, TraceMeta
from traces.toposort import sort_layers

FORMAT_NAME = "dtsim-trace"
FORMAT_VERSION = 1

_WHERE = ("cpu", "cpu_cores", "gpu", "machine")
"""Meta fields saying where a trace was measured, written only when set."""
_STEP = ("step_bytes_per_s", "step_overhead_s")
"""Meta fields of the optimizer step measured with the profile, written only when set."""


def to_dict(trace: Trace) -> dict[str, Any]:
    """The JSON-ready dictionary of a trace (format version 1)."""
    m = trace.meta
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "meta": {
            "model": m.model,
            "device": m.device,
            "batch_size": m.batch_size,
            "dtype": m.dtype,
            "framework": m.framework,
            "date": m.date,
            "provenance": m.provenance,
            **({"peak_flop_per_s": m.peak_flop_per_s} if m.peak_flop_per_s else {}),
            **{k: getattr(m, k) for k in _WHERE if getattr(m, k)},
            **{k: getattr(m, k) for k in _STEP if getattr(m, k)},
        },
        "layers": [
            {
                "name": layer.name,
                "op": layer.op,
                "kind": layer.kind,
                "forward_s": layer.forward_s,
                "backward_s": layer.backward_s,
                "param_bytes": layer.param_bytes,
                "activation_bytes": layer.activation_bytes,
                "flops": layer.flops,
                **{
                    k: getattr(layer, k)
                    for k in ("forward_fixed_s", "backward_fixed_s")
                    if getattr(layer, k)
                },
            }
            for layer in trace.layers
        ],
        "edges": [[trace.layers[s].name, trace.layers[d].name] for s, d in trace.edges],
    }


def save(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` to ``path`` atomically (a temporary file renamed into place)."""
    write_text(path, json.dumps(to_dict(trace), indent=1) + "\n")


def load(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file; malformed files raise :class:`TraceFormatError` naming the file,
    the field and the problem."""
    src = os.fspath(path)
    return from_dict(read_json(src), source=src)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON document in ``path`` (:class:`TraceFormatError` naming the file when
    it cannot be read or is not JSON)."""
    src = os.fspath(path)
    try:
        with open(src, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(src, "", unreadable(exc)) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(
            src, "", f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    return data


def from_dict(data: Any, source: str = "<dict>") -> Trace:
    """Build a trace from its JSON dictionary, validating every field."""
    v = _Validator(source)
    if not isinstance(data, dict):
        v.fail("", f"expected a JSON object at the top level, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != FORMAT_NAME:
        v.fail("format", f"expected {FORMAT_NAME!r}, got {fmt!r}")
    version = data.get("version")
    if version != FORMAT_VERSION:
        v.fail(
            "version", f"unsupported version {version!r}; this dtsim reads version {FORMAT_VERSION}"
        )
    meta_d = v.obj(data, "meta")
    meta = TraceMeta(
        model=v.string(meta_d, "meta", "model"),
        device=v.string(meta_d, "meta", "device"),
        batch_size=v.integer(meta_d, "meta", "batch_size", minimum=1),
        dtype=v.string(meta_d, "meta", "dtype", default="float32"),
        framework=v.string(meta_d, "meta", "framework", default=""),
        date=v.string(meta_d, "meta", "date", default=""),
        provenance=v.string(meta_d, "meta", "provenance", default=""),
        source_format="dtsim",
        peak_flop_per_s=(
            v.number(meta_d, "meta", "peak_flop_per_s") if "peak_flop_per_s" in meta_d else 0.0
        ),
        cpu=v.string(meta_d, "meta", "cpu", default=""),
        cpu_cores=v.integer(meta_d, "meta", "cpu_cores", default=0),
        gpu=v.string(meta_d, "meta", "gpu", default=""),
        machine=v.string(meta_d, "meta", "machine", default=""),
        **{k: v.number(meta_d, "meta", k) for k in _STEP if k in meta_d},
    )
    layers_l = data.get("layers")
    if not isinstance(layers_l, list) or not layers_l:
        v.fail("layers", "expected a non-empty list of layer objects")
    layers: list[Layer] = []
    names: set[str] = set()
    for i, ld in enumerate(layers_l):
        where = f"layers[{i}]"
        if not isinstance(ld, dict):
            v.fail(where, f"expected an object, got {type(ld).__name__}")
        name = v.string(ld, where, "name")
        if name in names:
            v.fail(f"{where}.name", f"duplicate layer name {name!r}")
        names.add(name)
        kind = v.string(ld, where, "kind", default="layer")
        if kind not in LAYER_KINDS:
            v.fail(f"{where}.kind", f"expected one of {', '.join(LAYER_KINDS)}, got {kind!r}")
        flops = ld.get("flops")
        if flops is not None:
            flops = v.number(ld, where, "flops")
        times = {k: v.number(ld, where, k) for k in ("forward_s", "backward_s")}
        fixed = {}
        for k in ("forward_fixed_s", "backward_fixed_s"):
            if k in ld:
                fixed[k] = v.number(ld, where, k)
                total = times[k.replace("_fixed", "")]
                if fixed[k] > total:
                    v.fail(f"{where}.{k}", f"{fixed[k]} is more than the whole time, {total}")
        layers.append(
            Layer(
                name=name,
                op=v.string(ld, where, "op", default=""),
                kind=kind,
                param_bytes=v.integer(ld, where, "param_bytes", default=0),
                activation_bytes=v.integer(ld, where, "activation_bytes", default=0),
                flops=flops,
                **times,
                **fixed,
            )
        )
    edges_l = data.get("edges", [])
    if not isinstance(edges_l, list):
        v.fail("edges", "expected a list of [src, dst] name pairs")
    edges: list[tuple[str, str]] = []
    for i, e in enumerate(edges_l):
        if not isinstance(e, list) or len(e) != 2 or not all(isinstance(x, str) for x in e):
            v.fail(f"edges[{i}]", f"expected a [src_name, dst_name] pair, got {e!r}")
        for x in e:
            if x not in names:
                v.fail(f"edges[{i}]", f"unknown layer name {x!r}")
        edges.append((e[0], e[1]))
    try:
        return sort_layers(meta, layers, edges)
    except ValueError as exc:
        v.fail("edges", str(exc))
        raise  # unreachable: fail() raises


class _Validator:
    """Field checks that raise :class:`TraceFormatError` with the field's path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> None:
        raise TraceFormatError(self.source, field, problem)

    def obj(self, d: dict[str, Any], key: str) -> dict[str, Any]:
        val = d.get(key)
        if not isinstance(val, dict):
            self.fail(key, "missing or not an object")
        return val

    def _get(self, d: dict[str, Any], where: str, key: str, default: Any) -> Any:
        if key not in d:
            if default is _REQUIRED:
                self.fail(f"{where}.{key}", "missing")
            return default
        return d[key]

    def string(self, d: dict[str, Any], where: str, key: str, default: Any = None) -> str:
        val = self._get(d, where, key, _REQUIRED if default is None else default)
        if not isinstance(val, str) or (default is None and not val):
            self.fail(f"{where}.{key}", f"expected a non-empty string, got {val!r}")
        return val

    def number(self, d: dict[str, Any], where: str, key: str) -> float:
        val = self._get(d, where, key, _REQUIRED)
        if (
            isinstance(val, bool)
            or not isinstance(val, int | float)
            or not math.isfinite(val)
            or val < 0
        ):
            self.fail(f"{where}.{key}", f"expected a non-negative number, got {val!r}")
        return float(val)

    def integer(
        self, d: dict[str, Any], where: str, key: str, default: Any = None, minimum: int = 0
    ) -> int:
        val = self._get(d, where, key, _REQUIRED if default is None else default)
        if isinstance(val, float) and val.is_integer():
            val = int(val)
        if isinstance(val, bool) or not isinstance(val, int) or val < minimum:
            self.fail(f"{where}.{key}", f"expected an integer >= {minimum}, got {val!r}")
        return val


_REQUIRED = object()
