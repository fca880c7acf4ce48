"""Layer traces: the data model and file formats shared by the simulator and real runs.

Public API: :class:`Layer`, :class:`TraceMeta`, :class:`Trace` (the model),
:func:`load_trace` (by built-in name or path), :func:`builtin_models`, :func:`save_trace`.
"""

from traces.catalog import builtin_models, default_model, load_builtin, load_file, load_trace
from traces.errors import TraceError, TraceFormatError, UnknownModelError
from traces.jsonfmt import save as save_trace
from traces.model import Layer, Trace, TraceMeta, chain

__all__ = [
    "Layer",
    "Trace",
    "TraceError",
    "TraceFormatError",
    "TraceMeta",
    "UnknownModelError",
    "builtin_models",
    "chain",
    "default_model",
    "load_builtin",
    "load_file",
    "load_trace",
    "save_trace",
]
