"""An emulated device: a model built from a layer trace whose compute takes the trace's
times as waits that use no CPU, as a GPU host's compute does.

**The device clock.** A GPU runs the kernels the host queues, one after another, while
the host goes on; the host waits only where it needs a result. :class:`DeviceClock` does
the same with times: an op issued at host time ``h`` starts at ``max(h, free_at)`` and
ends its duration later, and :meth:`DeviceClock.sync` sleeps until the device is free
(``time.sleep`` releases the GIL and uses no CPU). A sleep overshoots its target by
tens of microseconds; the clock counts the device as having gone on at the target, so
overshoots do not add up from op to op (a GPU's queue would not have waited for the
host either).

**Where the host waits.** Ops are only queued; the runtimes call :func:`sync` where a
result must exist: before a tensor leaves the rank (a DDP bucket's all-reduce, a
parameter-server push, gossip's exchange, a pipeline's activations and their
gradients: :class:`realrun.runtime.Messenger`, :class:`realrun.p2p.PostedLink`) and after
a forward, a backward and an iteration, as they synchronise a CUDA device (and, as
there, they record one span per pass rather than per layer).

**The model** (:func:`build`) has one :class:`EmulatedLayer` per trace layer of
:func:`traces.emulated.emulated_trace` (times dilated, sizes scaled), named as there,
reading its predecessors' outputs (a join reads several) and the model's inputs (one
per ``input`` layer). A layer's parameter is one float32 vector of the trace's size; its
output is ``(batch, elements)`` float32, zeros broadcast from one element (no memory).
Gradients between layers are left undefined (autograd still runs every layer's backward,
and never adds two activation-sized gradients where a layer's output has several
readers); a gradient that leaves the model (a pipeline stage's input) is zeros of its
full size, and weight gradients are real tensors of the parameters' size, so every
runtime moves real bytes. A layer's time for a batch of ``m``
samples is its fixed part plus its per-sample part times ``m / batch``, so a pipeline's
micro-batches take their share. When only the input or only the weight gradient is computed
(the zero-bubble split, :func:`backward_part`), the backward takes the input's or the
weight's share
(:data:`simcore.schemes._pipeline.WEIGHT_GRAD_SHARE`, as the simulator splits it).
Values carry no meaning; numerics are checked with real compute elsewhere.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from simcore.schemes._pipeline import WEIGHT_GRAD_SHARE
from traces.emulated import load_run_trace
from traces.model import Layer, Trace


class DeviceClock:
    """The emulated device's queue of ops, in host ``time.monotonic`` seconds (the
    recorders' clock; see module docs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.free_at = 0.0
        self.busy_s = 0.0
        self.ops = 0
        self._credit_until = 0.0
        self._credit_s = 0.0

    def issue(self, duration_s: float) -> float:
        """Queue an op of ``duration_s``; returns when it ends (host seconds)."""
        with self._lock:
            now = time.monotonic()
            if now < self._credit_until:
                now = max(self.free_at, now - self._credit_s)
            start = max(now, self.free_at)
            self.free_at = start + duration_s
            self.busy_s += duration_s
            self.ops += 1
            return self.free_at

    def sync(self) -> float:
        """Sleep until every queued op has ended; returns the overshoot (seconds)."""
        target = self.free_at
        now = time.monotonic()
        if now >= target:
            return 0.0
        time.sleep(target - now)
        woke = time.monotonic()
        over = max(0.0, woke - target)
        with self._lock:
            # the device went on at the target: an op issued within a moment of waking
            # (the host's own work included) starts as if the host had not overslept
            self._credit_s = over
            self._credit_until = woke + 0.002
        return over

    def reset(self) -> None:
        """Forget the queue (a new run in the same process)."""
        with self._lock:
            self.free_at = self.busy_s = self._credit_until = self._credit_s = 0.0
            self.ops = 0


CLOCK = DeviceClock()
"""This process's emulated device (one per rank, as one GPU per rank)."""


def sync() -> None:
    """Wait for this process's emulated device (nothing queued: returns at once)."""
    CLOCK.sync()


_PART = ["both"]
"""Which part of the backward autograd is running (:func:`backward_part`)."""

_SHARED_GRADS = [False]
"""Whether backwards return each layer's kept weight gradient (:func:`kept_weight_grads`)."""


class HeldBytes:
    """Bytes an emulated device would keep for the backward (:func:`counting_held`)."""

    __slots__ = ("nbytes",)

    def __init__(self) -> None:
        self.nbytes = 0


_HELD: list[HeldBytes | None] = [None]
"""Where the layers' kept outputs are counted (:func:`counting_held`), or ``None``."""


@contextlib.contextmanager
def counting_held() -> Iterator[HeldBytes]:
    """Within the block, every emulated layer that runs with autograd recording adds its
    output's bytes for the samples it got (the trace's activation bytes in proportion)
    to the count returned: what a GPU keeps for the backward, which the broadcast zeros
    of an emulated output do not take on the host (a run on the meta device, which only
    reads shapes, is not counted)."""
    held = HeldBytes()
    _HELD[0] = held
    try:
        yield held
    finally:
        _HELD[0] = None


@contextlib.contextmanager
def kept_weight_grads() -> Iterator[None]:
    """Within the block, a layer's weight gradient is one zero tensor the layer made once
    and keeps, not a new one per backward. A pipeline's stage runs a backward per
    micro-batch; a new gradient each time (plus summing them) is a memory pass over the
    stage's parameters on the host's CPU per micro-batch, about 3 ms per 10 MB here, work
    a GPU does on the device and the simulator does not charge to the host. Callers
    must only read the tensors they get (values carry no meaning on an emulated
    device)."""
    _SHARED_GRADS[0] = True
    try:
        yield
    finally:
        _SHARED_GRADS[0] = False


@contextlib.contextmanager
def backward_part(part: str) -> Iterator[None]:
    """Within the block, a backward computes only ``part`` of every layer's backward:
    ``"input"`` (the input gradient; a layer without parameters does all its backward
    here) or ``"weight"`` (the weight gradient), as the zero-bubble split's ``I`` and
    ``W`` passes do (autograd cannot tell a function which gradients a call wants)."""
    if part not in ("input", "weight"):
        raise ValueError(f"part: {part!r} is not allowed; choose input or weight")
    _PART[0] = part
    try:
        yield
    finally:
        _PART[0] = "both"


def _time_for(total_s: float, fixed_s: float, samples: int, batch: int) -> float:
    return fixed_s + max(0.0, total_s - fixed_s) * samples / batch


class _EmulatedOp(torch.autograd.Function):
    """One layer's forward and backward on the device clock (see module docs)."""

    @staticmethod
    def forward(ctx: Any, layer: EmulatedLayer, weight: torch.Tensor, *xs: torch.Tensor) -> Any:
        samples = xs[0].shape[0] if xs and xs[0].dim() else layer.batch
        ctx.set_materialize_grads(False)  # no activation-sized zeros for a missing gradient
        ctx.layer = layer
        ctx.samples = samples
        ctx.shapes = [(x.shape, x.dtype, x.device) for x in xs]
        # only a gradient that leaves the model (a stage's input) needs its real size
        ctx.leaves = [x.requires_grad and x.grad_fn is None for x in xs]
        device = xs[0].device if xs else weight.device
        if device.type != "meta":
            CLOCK.issue(
                _time_for(layer.spec.forward_s, layer.spec.forward_fixed_s, samples, layer.batch)
            )
        return torch.zeros((), device=device).expand(samples, layer.out_elements)

    @staticmethod
    def backward(ctx: Any, _grad: torch.Tensor) -> Any:
        layer: EmulatedLayer = ctx.layer
        wants_w = layer.has_params and ctx.needs_input_grad[1] and _PART[0] != "input"
        wants_x = _PART[0] != "weight"
        total = _time_for(
            layer.spec.backward_s, layer.spec.backward_fixed_s, ctx.samples, layer.batch
        )
        w_share = WEIGHT_GRAD_SHARE if layer.has_params else 0.0
        share = (w_share if wants_w else 0.0) + ((1.0 - w_share) if wants_x else 0.0)
        device = ctx.shapes[0][2] if ctx.shapes else layer.weight.device
        if device.type != "meta" and share > 0:
            CLOCK.issue(total * share)
        grad_w = None
        if wants_w:
            grad_w = layer.kept_grad() if _SHARED_GRADS[0] else torch.zeros_like(layer.weight)
        grads_x = [
            torch.zeros((), dtype=dt, device=dev).expand(shape) if need and leaf else None
            for (shape, dt, dev), need, leaf in zip(
                ctx.shapes, ctx.needs_input_grad[2:], ctx.leaves, strict=True
            )
        ]
        return (None, grad_w, *grads_x)


class EmulatedLayer(nn.Module):
    """One trace layer on the emulated device (see module docs).

    Attributes:
        spec: the layer of the emulated trace (times dilated, sizes scaled).
        batch: the batch its times are for.
        out_elements: float32 elements of its output per sample.
        weight: its parameters (a vector; a layer without parameters has an empty,
            frozen one, which takes no part in training).
    """

    fx_leaf = True
    """:func:`realrun.graph.trace_module` keeps this module as one node."""
    _is_impure = True
    """fx keeps its node when nothing reads its output (it takes device time)."""

    def __init__(self, spec: Layer, batch: int) -> None:
        super().__init__()
        self.spec = spec
        self.batch = batch
        self.out_elements = max(1, spec.activation_bytes // 4 // batch)
        numel = spec.param_bytes // 4
        self.has_params = numel > 0
        self.weight = nn.Parameter(torch.zeros(numel), requires_grad=self.has_params)
        self._kept_grad: torch.Tensor | None = None

    def kept_grad(self) -> torch.Tensor:
        """The weight gradient this layer keeps (:func:`kept_weight_grads`), made on
        first use."""
        if self._kept_grad is None:
            self._kept_grad = torch.zeros_like(self.weight)
        return self._kept_grad

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        held = _HELD[0]
        device = xs[0].device if xs else self.weight.device
        if held is not None and torch.is_grad_enabled() and device.type != "meta":
            samples = xs[0].shape[0] if xs and xs[0].dim() else self.batch
            held.nbytes += samples * self.out_elements * 4
        return _EmulatedOp.apply(self, self.weight, *xs)

    def extra_repr(self) -> str:
        return (
            f"{self.spec.op or 'layer'}: forward {self.spec.forward_s * 1e3:.3f} ms, "
            f"backward {self.spec.backward_s * 1e3:.3f} ms, {self.weight.numel()} params"
        )


class EmulatedModel(nn.Module):
    """A model built from a trace (see module docs; :func:`build` makes one, of the
    subclass that takes as many inputs as the trace has): inputs are the trace's ``input``
    layers, in trace order (one input when it has none); the output is its last layer's,
    with any other layer that has no successor and parameters or a backward time (a tuple
    then); a layer without successors, parameters or backward time is left unread."""

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        batch = trace.meta.batch_size
        inputs = [i for i, lay in enumerate(trace.layers) if lay.kind == "input"] or [-1]
        self.input_layers = tuple(inputs)
        preds = trace.predecessors
        succs = trace.successors
        plan: list[tuple[str, tuple[int, ...]]] = []
        for i, lay in enumerate(trace.layers):
            if lay.kind == "input":
                continue
            self.add_module(lay.name, EmulatedLayer(lay, batch))
            reads = tuple(preds[i]) or (inputs[0],)
            plan.append((lay.name, reads))
        self.plan = tuple(plan)
        sinks = [i for i, lay in enumerate(trace.layers) if lay.kind != "input" and not succs[i]]
        # a sink that costs nothing and owns nothing (an LSTM's unused state, ``getitem``)
        # is dropped as a real model drops it; the others (the last layer, an auxiliary
        # head) reach the output, which the loss reads
        self.sinks = tuple(
            i
            for i in sinks
            if i == sinks[-1]
            or trace.layers[i].param_bytes
            or trace.layers[i].backward_s
            or trace.layers[i].backward_fixed_s
        )

    def run(self, xs: tuple[torch.Tensor, ...]) -> Any:
        """The model's output for inputs ``xs`` (one per input layer)."""
        values: dict[int, Any] = dict(zip(self.input_layers, xs, strict=True))
        index = {lay.name: i for i, lay in enumerate(self.trace.layers)}
        for name, reads in self.plan:
            values[index[name]] = getattr(self, name)(*(values[r] for r in reads))
        outs = tuple(values[i] for i in self.sinks)
        return outs[0] if len(outs) == 1 else outs


# fx reads the inputs from forward's signature (no *args), so one class per input count


class _OneInput(EmulatedModel):
    def forward(self, x0: torch.Tensor) -> Any:
        return self.run((x0,))


class _TwoInputs(EmulatedModel):
    def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> Any:
        return self.run((x0, x1))


class _ThreeInputs(EmulatedModel):
    def forward(self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor) -> Any:
        return self.run((x0, x1, x2))


class _FourInputs(EmulatedModel):
    def forward(
        self, x0: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor
    ) -> Any:
        return self.run((x0, x1, x2, x3))


_BY_INPUTS: dict[int, type[EmulatedModel]] = {
    1: _OneInput,
    2: _TwoInputs,
    3: _ThreeInputs,
    4: _FourInputs,
}
MAX_INPUTS = len(_BY_INPUTS)
"""Most ``input`` layers an emulated model takes."""


def input_elements(trace: Trace) -> list[int]:
    """Float32 elements per sample of each of the model's inputs (a trace without an
    ``input`` layer gets one input of one element, which its first layers read)."""
    b = trace.meta.batch_size
    sizes = [max(1, lay.activation_bytes // 4 // b) for lay in trace.layers if lay.kind == "input"]
    return sizes or [1]


def run_trace(ref: str) -> Trace:
    """The emulated trace the reference ``ref`` names (see :mod:`traces.emulated`)."""
    return _run_trace(ref)


_CACHE: dict[str, Trace] = {}


def _run_trace(ref: str) -> Trace:
    hit = _CACHE.get(ref)
    if hit is None:
        hit = _CACHE[ref] = load_run_trace(ref)
    return hit


def build(ref: str) -> EmulatedModel:
    """A fresh emulated model for ``ref`` on the current default device
    (``ValueError`` for a trace of more than :data:`MAX_INPUTS` inputs)."""
    trace = run_trace(ref)
    n = len(input_elements(trace))
    if n not in _BY_INPUTS:
        raise ValueError(
            f"model: {trace.meta.model} has {n} input layers; an emulated model takes "
            f"at most {MAX_INPUTS}"
        )
    return _BY_INPUTS[n](trace)
