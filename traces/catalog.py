"""Built-in traces and loading a trace by model name or file path.

Built-in traces live in ``traces/builtin/`` and are listed in its ``index.json``: one entry
per model with the file, its format, a description and its provenance. The PipeDream
profiles keep their MIT licence in ``builtin/pipedream/LICENSE.txt``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

import traces.jsonfmt as jsonfmt
import traces.kineto as kineto
import traces.pipedream as pipedream
from traces.errors import TraceFormatError, UnknownModelError
from traces.model import Trace


@dataclass(frozen=True)
class BuiltinTrace:
    """An entry of the built-in catalogue (what ``sim models`` lists)."""

    name: str
    description: str
    file: str
    format: str
    device: str
    provenance: str
    batch_size: int | None = None
    framework: str = ""


@cache
def _index() -> tuple[str, dict[str, BuiltinTrace]]:
    text = resources.files("traces.builtin").joinpath("index.json").read_text(encoding="utf-8")
    data = json.loads(text)
    models = {name: BuiltinTrace(name=name, **entry) for name, entry in data["models"].items()}
    return data["default"], models


def default_model() -> str:
    """Name of the default built-in model (``resnet50``)."""
    return _index()[0]


def builtin_models() -> dict[str, BuiltinTrace]:
    """All built-in traces by name, sorted by name."""
    return dict(sorted(_index()[1].items()))


def load_builtin(name: str) -> Trace:
    """Load the built-in trace called ``name`` (``UnknownModelError`` if there is none)."""
    entries = _index()[1]
    if name not in entries:
        raise UnknownModelError(name, sorted(entries))
    return _load_builtin_cached(name)


@cache
def _load_builtin_cached(name: str) -> Trace:
    entry = _index()[1][name]
    path = resources.files("traces.builtin").joinpath(entry.file)
    with resources.as_file(path) as real:
        trace = load_file(real, fmt=entry.format, model=name, batch_size=entry.batch_size)
    meta = replace(
        trace.meta,
        model=name,
        device=entry.device,
        provenance=entry.provenance,
        framework=entry.framework or trace.meta.framework,
    )
    return Trace(meta, trace.layers, trace.edges)


FORMATS = ("dtsim", "pipedream", "kineto", "chakra")
"""Trace file formats that can be read."""


def is_chakra_path(path: str) -> bool:
    """Whether ``path`` names Chakra execution traces: a ``.et`` file (gzipped or not) or a
    directory (of ``NAME.RANK.et`` files)."""
    return os.path.isdir(path) or path.endswith((".et", ".et.gz"))


def load_file(path: str | os.PathLike[str], fmt: str | None = None, **kwargs: object) -> Trace:
    """Load a trace file; the format is ``fmt`` (one of :data:`FORMATS`) or guessed:
    ``.json`` files are dtsim's format or, when they hold ``traceEvents``, Kineto traces;
    ``.et`` files and directories Chakra execution traces (:mod:`traces.chakra`); anything
    else is PipeDream ``graph.txt``. ``kwargs`` (``model``, ``batch_size``...) go to the
    PipeDream, Kineto and Chakra importers, which need them when the file does not say."""
    p = os.fspath(path)
    if fmt is None and p.endswith(".json"):
        data = jsonfmt.read_json(p)
        if kineto.is_kineto(data):
            return kineto.from_dict(data, source=p, **kwargs)  # type: ignore[arg-type]
        if isinstance(data, dict) and "nodes" in data and "schema" in data:
            raise TraceFormatError(
                p,
                "",
                "a PyTorch execution trace has no durations of its own: link it with the "
                "Kineto trace of the same run (sim trace convert ET.json OUT.json "
                "--kineto KINETO.json)",
            )
        return jsonfmt.from_dict(data, source=p)
    if fmt is None and is_chakra_path(p):
        fmt = "chakra"
    fmt = fmt or "pipedream"
    if fmt == "chakra":
        import traces.chakra as chakra

        return chakra.load(p, **kwargs)  # type: ignore[arg-type]
    if fmt == "dtsim":
        return jsonfmt.load(p)
    if fmt == "pipedream":
        return pipedream.load(p, **kwargs)  # type: ignore[arg-type]
    if fmt == "kineto":
        return kineto.load(p, **kwargs)  # type: ignore[arg-type]
    raise TraceFormatError(p, "", f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")


def load_trace(model: str) -> Trace:
    """A trace by built-in model name or by file path (``UnknownModelError`` when it is
    neither; ``TraceFormatError`` when the file is malformed)."""
    entries = _index()[1]
    if model in entries:
        return load_builtin(model)
    if os.path.exists(model):
        return load_file(model)
    raise UnknownModelError(model, sorted(entries))
