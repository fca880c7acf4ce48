"""Models named by reference: a zoo name, ``path/to/file.py:NAME`` or ``package.module:NAME``.

A reference other than a zoo name points at a callable ``NAME`` that takes no arguments
and returns either an ``nn.Module`` or a pair ``(module, example_input)``, where
``example_input`` is a tensor or a tuple of tensors whose first dimension is the batch.
The example fixes the inputs' per-sample shapes and dtypes; integer inputs (token ids) are
drawn from ``[0, max(example) + 1)``. A callable returning only a module needs the
per-sample input shape (``input_shape``, e.g. ``(3, 32, 32)``), read as one float32 input.

:func:`resolve_model` turns a reference into a :class:`ResolvedModel`, which builds the
model and makes batches of random inputs exactly as the zoo does, so every place that
takes a zoo model (real runs, the profiler, the pipeline stages, analytic traces) takes a
reference. A file path is made absolute, so rank processes started elsewhere (another
working folder, a network namespace) load the same file. A reference starting with
``emulated:`` names a model built from a layer trace that runs on an emulated device
(:mod:`traces.emulated`, :mod:`realrun.emudevice`).

Every problem (file missing, ``NAME`` not defined or not callable, an import that fails,
a wrong return value, a missing input shape) is a :class:`simcore.settings.ConfigError`
naming the setting (``model`` or ``input_shape``) in one line.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from realrun import zoo
from realrun.zoo import InputSpec, is_zoo, looks_like_reference
from simcore.settings import ConfigError
from traces.emulated import is_emulated_ref, parse_ref

FORMS = "a zoo model name, FILE.py:NAME or package.module:NAME"
"""The forms of a model reference, for error messages."""


class MissingInputShape(ConfigError):
    """A model whose callable returns only a module, and no input shape was given."""

    def __init__(self, ref: str) -> None:
        super().__init__(
            "input_shape",
            None,
            f"{ref} returns only a module, so give the shape of one input sample, such as "
            "3,32,32 or 64 (float32)",
        )

    def describe(self, shown_name: str) -> str:
        """The message, with the setting shown as ``shown_name``."""
        return f"{shown_name}: missing; {self.allowed}"


def parse_input_shape(text: str | tuple[int, ...] | list[int] | None) -> tuple[int, ...] | None:
    """``"3,32,32"`` (or ``3x32x32``, or a sequence of ints) -> ``(3, 32, 32)``; ``None`` or
    empty text -> ``None``. ``ConfigError`` (setting ``input_shape``) for anything else."""
    if text is None:
        return None
    if isinstance(text, tuple | list):
        parts: list[Any] = list(text)
    else:
        s = str(text).strip().strip("()[]")
        if not s or s == "auto":
            return None
        sep = "x" if re.fullmatch(r"\d+(\s*x\s*\d+)+", s) else ","
        parts = [p.strip() for p in s.split(sep)]
    try:
        shape = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        shape = ()
    if not shape or any(d < 1 for d in shape) or any(isinstance(p, bool) for p in parts):
        raise ConfigError(
            "input_shape",
            text,
            "expected the shape of one sample as positive integers separated by commas, "
            "such as 3,32,32 or 64",
        )
    return shape


@dataclass(frozen=True)
class ResolvedModel:
    """A model ready to build, whether from the zoo or the user's own.

    Attributes:
        ref: the canonical reference: the zoo name, ``/absolute/path.py:NAME`` or
            ``package.module:NAME``; what a job stores so every rank resolves the same.
        name: a short name for traces and messages (``resnet18``, ``mynet.Net``).
        inputs: the model's inputs, one :class:`~realrun.zoo.InputSpec` per tensor.
        input_shape: the per-sample shape given by the user (``None`` when the model
            brings its own example, or for zoo models).
    """

    ref: str
    name: str
    inputs: tuple[InputSpec, ...]
    input_shape: tuple[int, ...] | None = None

    @property
    def is_zoo(self) -> bool:
        """Whether this is a zoo model."""
        return is_zoo(self.ref)

    def build(self) -> Any:
        """A fresh ``nn.Module`` on the current default device (``with
        torch.device("meta"):`` builds one without memory); weights come from torch's
        global generator, so ``torch.manual_seed`` before makes them reproducible."""
        if self.is_zoo:
            return zoo.build(self.ref)
        if is_emulated_ref(self.ref):
            from realrun import emudevice

            return emudevice.build(self.ref)
        return build_reference(self.ref)

    def example_inputs(
        self, batch_size: int, device: Any = "cpu", seed: int = 0
    ) -> tuple[Any, ...]:
        """``batch_size`` random samples of every input on ``device`` (reproducible for a
        given ``seed``; the meta device gets shapes only)."""
        if self.is_zoo:
            return zoo.example_inputs(self.ref, batch_size, device, seed)
        return make_inputs(self.inputs, batch_size, device, seed)


def _resolve_emulated(ref: str) -> ResolvedModel:
    """An emulated model (``ConfigError`` naming ``model`` when the reference or its
    trace cannot be used)."""
    from traces.catalog import TraceFormatError, UnknownModelError

    try:
        from realrun import emudevice

        trace = emudevice.run_trace(ref)
    except (ValueError, UnknownModelError, TraceFormatError, OSError) as exc:
        raise ConfigError("model", ref, _one_line(exc)) from None
    inputs = tuple(InputSpec((n,)) for n in emudevice.input_elements(trace))
    return ResolvedModel(ref, f"{parse_ref(ref).trace} (emulated)", inputs)


def build_reference(ref: str) -> Any:
    """A fresh module from the callable ``ref`` names (``FILE.py:NAME`` or
    ``package.module:NAME``), without its example; ``ConfigError`` if it cannot be loaded."""
    canonical = canonical_ref(ref)
    try:
        factory = _factory(canonical)
    except ConfigError as exc:
        raise ConfigError("model", ref, exc.allowed.replace(canonical, ref)) from None
    value = factory()
    return value[0] if isinstance(value, tuple) else value


def make_inputs(
    specs: tuple[InputSpec, ...], batch_size: int, device: Any = "cpu", seed: int = 0
) -> tuple[Any, ...]:
    """Random inputs of ``batch_size`` samples for ``specs`` (see :func:`zoo.example_inputs`)."""
    import torch

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    meta = torch.device(device).type == "meta"
    out = []
    for spec in specs:
        shape = (batch_size, *spec.shape)
        dtype = getattr(torch, spec.dtype)
        if meta:
            t = torch.empty(shape, dtype=dtype, device="meta")
        elif not dtype.is_floating_point:
            t = torch.randint(0, max(1, spec.high), shape, generator=gen, dtype=dtype)
        else:
            t = torch.randn(shape, generator=gen, dtype=dtype)
        out.append(t.to(device))
    return tuple(out)


def resolve_model(ref: str, input_shape: tuple[int, ...] | str | None = None) -> ResolvedModel:
    """The model ``ref`` names: a zoo name, ``path/to/file.py:NAME`` or
    ``package.module:NAME`` (see the module docs); ``input_shape`` is the per-sample shape
    of the one float32 input when ``NAME`` returns only a module (ignored for zoo models and
    for callables that return an example). Raises ``ConfigError`` (one line, naming
    ``model`` or ``input_shape``) when the reference cannot be used."""
    shape = parse_input_shape(input_shape)
    return _resolve(str(ref), shape)


@functools.lru_cache(maxsize=64)
def _resolve(ref: str, shape: tuple[int, ...] | None) -> ResolvedModel:
    if is_zoo(ref):
        return ResolvedModel(ref, ref, zoo.get(ref).inputs)
    if is_emulated_ref(ref):
        return _resolve_emulated(ref)
    if not looks_like_reference(ref):
        raise ConfigError("model", ref, f"choose {FORMS}; zoo models: {', '.join(zoo.names())}")
    canonical = canonical_ref(ref)
    try:
        factory = _factory(canonical)
    except ConfigError as exc:  # name the model as the user wrote it
        raise ConfigError("model", ref, exc.allowed.replace(canonical, ref)) from None
    import torch

    try:
        with torch.random.fork_rng(devices=[]):  # leave the caller's seeding alone
            value = factory()
    except Exception as exc:
        raise ConfigError("model", ref, f"calling it failed: {_one_line(exc)}") from None
    module, example = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            "model",
            ref,
            f"it returned {_describe(value)}; it must return an nn.Module or a pair "
            "(module, example_input)",
        )
    if example is None:
        if shape is None:
            raise MissingInputShape(ref)
        inputs: tuple[InputSpec, ...] = (InputSpec(shape),)
    else:
        tensors = example if isinstance(example, tuple | list) else (example,)
        if not tensors or not all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in tensors):
            raise ConfigError(
                "model",
                ref,
                f"its example input is {_describe(example)}; it must be a tensor or a tuple "
                "of tensors whose first dimension is the batch",
            )
        inputs = tuple(_spec_of(t) for t in tensors)
        shape = None
    resolved = ResolvedModel(canonical, _short_name(canonical), inputs, shape)
    try:  # a forward on the meta device: shapes only, nothing allocated
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            resolved.build()(*resolved.example_inputs(2, "meta"))
    except NotImplementedError:
        pass  # an op the meta device lacks: the run itself will tell
    except Exception as exc:
        if "meta" in str(exc).lower():
            return resolved  # the same, said in other words
        field, value = ("input_shape", shape) if shape else ("model", ref)
        raise ConfigError(
            field,
            ",".join(map(str, value)) if shape else value,
            f"the model cannot run on a batch of inputs of this shape ({_one_line(exc)[:200]})",
        ) from None
    return resolved


def canonical_ref(ref: str) -> str:
    """``ref`` with a file path made absolute (``package.module:NAME`` and zoo names as
    they are)."""
    left, _, name = ref.rpartition(":")
    if _is_path(left):
        return f"{os.path.abspath(os.path.expanduser(left))}:{name}"
    return ref


def _is_path(left: str) -> bool:
    return left.endswith(".py") or os.sep in left or "/" in left


def _short_name(ref: str) -> str:
    left, _, name = ref.rpartition(":")
    stem = os.path.splitext(os.path.basename(left))[0] if _is_path(left) else left
    return f"{stem}.{name}"


@functools.lru_cache(maxsize=64)
def _factory(ref: str) -> Callable[[], Any]:
    """The callable a (canonical) reference names."""
    left, _, name = ref.rpartition(":")
    if _is_path(left):
        if not os.path.isfile(left):
            raise ConfigError("model", ref, "no such file; give FILE.py:NAME with an existing file")
        module = _load_file(ref, left)
    else:
        try:
            module = _import_here(left)
        except ModuleNotFoundError as exc:
            if exc.name and left.startswith(exc.name):
                raise ConfigError(
                    "model", ref, f"no module named {exc.name!r} can be imported; give {FORMS}"
                ) from None
            raise ConfigError("model", ref, f"importing it failed: {_one_line(exc)}") from None
        except Exception as exc:
            raise ConfigError("model", ref, f"importing it failed: {_one_line(exc)}") from None
    if not hasattr(module, name):
        own = module.__name__
        defined = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == own
        )
        listed = ", ".join(defined) if defined else "nothing callable"
        raise ConfigError("model", ref, f"{left} does not define {name!r}; it defines: {listed}")
    obj = getattr(module, name)
    if not callable(obj):
        raise ConfigError(
            "model", ref, f"{name} is {_describe(obj)}, not a callable returning a model"
        )
    return obj


def _import_here(name: str) -> Any:
    """Import module ``name``; a package in the current folder is found as ``python -m``
    finds it (the ``sim`` script's own path does not hold the current folder, a rank's
    ``python -m realrun`` does)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = name.split(".")[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, here)
        return importlib.import_module(name)


def _load_file(ref: str, path: str) -> Any:
    mod_name = "dtsim_user_model_" + str(abs(hash(path)))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("model", ref, "cannot be loaded as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(mod_name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError("model", ref, f"importing {path} failed: {_one_line(exc)}") from None
    return module


def _spec_of(t: Any) -> InputSpec:
    dtype = str(t.dtype).removeprefix("torch.")
    high = 0
    if not t.is_floating_point():
        high = int(t.max()) + 1 if t.numel() and t.device.type != "meta" else 2
    return InputSpec(tuple(int(s) for s in t.shape[1:]), dtype, high)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} items"
    return f"a value of type {type(value).__name__}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = [
    "FORMS",
    "MissingInputShape",
    "ResolvedModel",
    "build_reference",
    "canonical_ref",
    "is_zoo",
    "looks_like_reference",
    "make_inputs",
    "parse_input_shape",
    "resolve_model",
]
