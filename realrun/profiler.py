"""The layer profiler: a zoo model (or any fx-traceable module) -> a :class:`~traces.Trace`.

Method (measured, ``--device cpu|cuda``):

1. The model is traced with ``torch.fx`` into its layer graph (:mod:`realrun.graph`) and run
   once to capture every layer's inputs.
2. Each layer is then timed **in isolation** on its captured inputs: forward with autograd
   recording (as in training), then backward with ``torch.autograd.grad`` from a gradient of
   ones for the layer's output to the inputs that need gradients (outputs of earlier layers
   that depend on parameters; never the data) and to its own parameters.
3. Every timing does ``warmup`` untimed calls, then ``repeats`` samples, each the mean of
   enough back-to-back calls to last ``min_sample_s``; the layer's time is the median
   sample. CUDA times use CUDA events; CPU times with one thread use the process's CPU
   time, so that other processes on a shared machine do not inflate them (see
   :class:`_Clock`), and wall time otherwise.
4. Forward FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (matrix
   multiplications and convolutions; element-wise ops count zero).

Analytic method (``analytic=True``): the model is built on the ``meta`` device (no memory,
no compute), FLOPs of each layer's forward *and* backward are counted the same way (the
backward count comes from the backward pass itself: about twice the forward, less where
no input gradient is needed, as in the first layer), and time is
``flops / (device_flops * efficiency)``. With ``memory_bytes_per_s`` set, a layer is never
faster than moving its bytes (forward: inputs + output + parameters; backward: twice that),
which gives element-wise layers (ReLU, batch norm, add) a time; without it they cost zero.
"""

from __future__ import annotations

import datetime
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode

from realrun.graph import LayerGraph, LayerNode, layer_graph, nbytes, tensors_in, used_output
from realrun.machine import cpu_model, trace_fields
from realrun.options import DEFAULT_EFFICIENCY, DEVICES, DTYPES
from realrun.usermodel import resolve_model
from traces.model import Layer, Trace, TraceMeta


class ProfileError(ValueError):
    """The profile cannot be made as asked (the message says why and what to do)."""


@dataclass(frozen=True)
class ProfileConfig:
    """How to profile.

    Attributes:
        batch_size: samples per profiled batch.
        device: ``"cpu"`` or ``"cuda"`` (ignored by the analytic method).
        dtype: element type of parameters and activations (one of :data:`DTYPES`).
        warmup: untimed calls before each timing.
        repeats: timed samples per timing (the median is kept).
        min_sample_s: each sample lasts at least this long (back-to-back calls averaged).
        threads: torch intra-op threads (``None``: leave torch's setting alone).
        analytic: build times from FLOPs on the meta device instead of measuring.
        device_flops: peak FLOP/s of the device the analytic times are for.
        efficiency: fraction of ``device_flops`` the analytic layers reach.
        memory_bytes_per_s: memory bandwidth for the analytic floor (0: no floor).
        seed: seed of the random example inputs.
        progress: show a progress bar on stderr.
    """

    batch_size: int
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 2
    repeats: int = 5
    min_sample_s: float = 1e-3
    threads: int | None = 1
    analytic: bool = False
    device_flops: float = 0.0
    efficiency: float = DEFAULT_EFFICIENCY
    memory_bytes_per_s: float = 0.0
    seed: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ProfileError(f"batch size must be positive, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise ProfileError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise ProfileError(f"device {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.warmup < 0 or self.repeats < 1:
            raise ProfileError("warmup must be >= 0 and repeats >= 1")
        if self.threads is not None and self.threads < 1:
            raise ProfileError(f"threads must be at least 1, got {self.threads}")
        if self.analytic and not self.device_flops > 0:
            raise ProfileError(
                "the analytic method needs the device's peak FLOP/s (--device-flops, e.g. 15.7e12)"
            )
        if not 0 < self.efficiency <= 1:
            raise ProfileError(f"efficiency must be in (0, 1], got {self.efficiency}")


# ---- entry points ------------------------------------------------------------------------


def profile_model(
    name: str, config: ProfileConfig, input_shape: tuple[int, ...] | None = None
) -> Trace:
    """Profile the model ``name`` refers to (a zoo model, ``FILE.py:NAME`` or
    ``package.module:NAME``, see :mod:`realrun.usermodel`; ``input_shape`` for a callable
    returning only a module) and return its trace."""
    resolved = resolve_model(name, input_shape)
    device = "meta" if config.analytic else _torch_device(config)
    torch.manual_seed(config.seed)
    with torch.device(device):
        model = resolved.build()
    inputs = resolved.example_inputs(config.batch_size, device, seed=config.seed)
    return profile_module(model, inputs, config, resolved.name)


def profile_module(
    model: torch.nn.Module, inputs: tuple[Any, ...], config: ProfileConfig, name: str
) -> Trace:
    """Profile any fx-traceable ``model`` on ``inputs`` (already on the right device; the
    first dimension of each is the batch) and return its trace, called ``name``."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    dtype = getattr(torch, config.dtype)
    model = model.to(dtype).train()
    inputs = tuple(t.to(dtype) if torch.is_floating_point(t) else t for t in inputs)
    graph = layer_graph(model, inputs)
    clock = _Clock(next(iter(tensors_in(inputs))).device)
    layers: list[Layer] = []
    from tqdm import tqdm

    bar = tqdm(
        graph.layers,
        desc=f"profiling {name}",
        unit="layer",
        leave=False,
        disable=not config.progress,
    )
    for node in bar:
        bar.set_postfix_str(node.name[-30:], refresh=False)
        layers.append(_profile_layer(graph, node, config, clock))
    bar.close()
    where: dict[str, Any] = {"date": datetime.date.today().isoformat()}
    if not config.analytic:  # a measurement: record the machine and when
        where = trace_fields(torch.cuda.get_device_name() if config.device == "cuda" else "")
    meta = TraceMeta(
        model=name,
        device=_device_name(config),
        batch_size=config.batch_size,
        dtype=config.dtype,
        framework=f"PyTorch {torch.__version__}",
        provenance=_provenance(config, clock.method),
        source_format="dtsim",
        peak_flop_per_s=config.device_flops if config.analytic else 0.0,
        **where,
    )
    return Trace(meta, tuple(layers), _edge_indices(graph))


def time_training_step(
    model: torch.nn.Module, inputs: tuple[Any, ...], *, warmup: int = 2, repeats: int = 5
) -> float:
    """Median seconds of one whole forward + backward of ``model`` on ``inputs`` (the
    gradient of every output is ones, as in the isolated layer timings; parameter gradients
    are reset to ``None`` before each step, so no accumulation)."""
    model.train()
    clock = _Clock(next(iter(tensors_in(inputs))).device)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        outs = [t for t in tensors_in(model(*inputs)) if t.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])

    return clock.median(step, warmup=warmup, repeats=repeats, min_sample_s=0.0)


# ---- one layer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCall:
    """A layer made callable on its captured inputs.

    Attributes:
        forward: runs the layer's forward (with autograd recording) and returns its output.
        grad_inputs: the tensors backward computes gradients for (inputs that need them
            and the layer's own parameters).
    """

    forward: Callable[[], Any]
    grad_inputs: tuple[torch.Tensor, ...]

    def backward_fn(self, node: fx.Node) -> Callable[[], Any] | None:
        """A function running the layer's backward on a fresh forward's graph (kept alive
        for repeated calls), or ``None`` when the layer has no backward."""
        outs = [t for t in used_output(node, self.forward()) if t.requires_grad]
        if not outs or not self.grad_inputs:
            return None
        grads = [torch.ones_like(t) for t in outs]
        inputs = list(self.grad_inputs)

        def run() -> Any:
            return torch.autograd.grad(outs, inputs, grads, retain_graph=True, allow_unused=True)

        return run


def layer_call(graph: LayerGraph, node: LayerNode) -> LayerCall:
    """The callable forward of ``node`` on inputs captured in ``graph.values``: fresh leaf
    tensors, requiring gradients where backward would compute them."""
    n = node.node
    grad_inputs: list[torch.Tensor] = []

    def leaf(arg: fx.Node) -> Any:
        return _detach(graph.values[arg.name], arg.name in graph.grad_nodes, grad_inputs)

    args = fx.node.map_arg(n.args, leaf)
    kwargs = fx.node.map_arg(n.kwargs, leaf)
    gm = graph.module
    fn: Callable[[], Any]
    if n.op == "call_module":
        mod = gm.get_submodule(str(n.target))
        grad_inputs += [p for p in mod.parameters() if p.requires_grad]

        def fn() -> Any:
            return mod(*args, **kwargs)
    elif n.op == "call_method":

        def fn() -> Any:
            return getattr(args[0], str(n.target))(*args[1:], **kwargs)
    else:
        target = n.target

        def fn() -> Any:
            return target(*args, **kwargs)  # type: ignore[operator]

    return LayerCall(fn, tuple(grad_inputs))


def _detach(value: Any, needs_grad: bool, grad_inputs: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if needs_grad and torch.is_floating_point(t):
            t.requires_grad_(True)
            grad_inputs.append(t)
        return t
    if isinstance(value, list | tuple):
        items = [_detach(v, needs_grad, grad_inputs) for v in value]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    return value


def _profile_layer(
    graph: LayerGraph, node: LayerNode, config: ProfileConfig, clock: _Clock
) -> Layer:
    base = Layer(
        name=node.name,
        op=node.op,
        kind=node.kind,
        forward_s=0.0,
        backward_s=0.0,
        param_bytes=node.param_bytes,
        activation_bytes=node.activation_bytes,
    )
    if node.kind == "input":
        return base
    call = layer_call(graph, node)
    with torch.enable_grad():
        fwd_flops = _count_flops(call.forward)
        backward = call.backward_fn(node.node)
        if config.analytic:
            bwd_flops = _count_flops(backward) if backward else 0
            moved = (
                nbytes([graph.values[i.name] for i in node.node.all_input_nodes])
                + node.activation_bytes
                + node.param_bytes
            )
            fwd_s = _analytic_s(fwd_flops, moved, config)
            bwd_s = _analytic_s(bwd_flops, 2 * moved, config) if backward else 0.0
        else:
            kw = {
                "warmup": config.warmup,
                "repeats": config.repeats,
                "min_sample_s": config.min_sample_s,
            }
            fwd_s = clock.median(call.forward, **kw)
            bwd_s = clock.median(backward, **kw) if backward else 0.0
    return replace(base, forward_s=fwd_s, backward_s=bwd_s, flops=float(fwd_flops))


def _count_flops(fn: Callable[[], Any]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def _analytic_s(flops: float, moved_bytes: int, config: ProfileConfig) -> float:
    t = flops / (config.device_flops * config.efficiency)
    if config.memory_bytes_per_s > 0:
        t = max(t, moved_bytes / config.memory_bytes_per_s)
    return t


# ---- timing ------------------------------------------------------------------------------


class _Clock:
    """Median per-call time of a function on one device.

    CUDA: CUDA events. CPU with one torch thread: the process's CPU time
    (``time.process_time``), which other processes competing for the cores of a shared
    machine do not inflate (on an idle machine it equals wall time for single-threaded
    work). CPU with more threads: wall time (``time.perf_counter``).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.timer = time.process_time if torch.get_num_threads() == 1 else time.perf_counter

    @property
    def method(self) -> str:
        """How this clock measures, for provenance."""
        if self.cuda:
            return "CUDA events"
        return (
            "process CPU time"
            if self.timer is time.process_time
            else "wall time (time.perf_counter)"
        )

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _elapsed(self, fn: Callable[[], Any], calls: int) -> float:
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = self.timer()
        for _ in range(calls):
            fn()
        return self.timer() - t0

    def median(
        self, fn: Callable[[], Any], *, warmup: int, repeats: int, min_sample_s: float
    ) -> float:
        """Warm up, size the samples to ``min_sample_s``, return the median seconds/call."""
        for _ in range(warmup):
            fn()
        self._sync()
        single = self._elapsed(fn, 1)
        calls = max(1, min(1000, math.ceil(min_sample_s / max(single, 1e-9))))
        return statistics.median(self._elapsed(fn, calls) / calls for _ in range(repeats))


# ---- metadata ----------------------------------------------------------------------------


def _torch_device(config: ProfileConfig) -> str:
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ProfileError(
            f"--device cuda: no CUDA GPU is usable here (torch "
            f"{torch.__version__}); use --device cpu, or --analytic with "
            "--device-flops"
        )
    return config.device


def _device_name(config: ProfileConfig) -> str:
    if config.analytic:
        return f"analytic:{config.device_flops:.4g}"
    if config.device == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


def _provenance(config: ProfileConfig, clock: str) -> str:
    if config.analytic:
        mem = (
            f"; never faster than moving its bytes at {config.memory_bytes_per_s:.4g} B/s "
            "(forward: inputs + output + parameters, backward: twice that)"
            if config.memory_bytes_per_s > 0
            else "; memory traffic ignored"
        )
        return (
            f"analytic estimate by dtsim (realrun.profiler), not a measurement: torch.fx "
            f"layer graph built on the meta device; each layer's time = FLOPs counted by "
            f"torch.utils.flop_counter (backward FLOPs counted from the backward pass) / "
            f"({config.device_flops:.4g} FLOP/s x efficiency {config.efficiency:g})"
            f"{mem}"
        )
    where = torch.cuda.get_device_name() if config.device == "cuda" else f"CPU {cpu_model()}"
    return (
        f"measured by dtsim (realrun.profiler): isolated layer timing on a torch.fx "
        f"layer graph; per layer {config.warmup} warm-up calls, then the median of "
        f"{config.repeats} samples of >= {config.min_sample_s:g} s of back-to-back "
        f"calls; forward with autograd recording, backward via torch.autograd.grad "
        f"from a gradient of ones; {torch.get_num_threads()} torch thread(s); {where}, "
        f"{clock}; "
        f"FLOPs from torch.utils.flop_counter"
    )


def _edge_indices(graph: LayerGraph) -> tuple[tuple[int, int], ...]:
    index = {layer.name: i for i, layer in enumerate(graph.layers)}
    return tuple(sorted((index[s], index[d]) for s, d in graph.edges))
