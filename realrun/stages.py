"""A model split into pipeline stages along a partition of its trace.

The partitioner (:mod:`simcore.partition`) works on a trace whose layers are those of
:func:`realrun.graph.layer_graph`, same names, same order. :func:`split_model` takes the
stages' layer indices and cuts the model's ``torch.fx`` graph along them:

* every fx node that is a layer runs in the stage the partition gives it (the model's
  inputs in stage 0, the loss after the model's output in the last stage);
* nodes folded away in the layer graph (``getitem``, ``getattr``, ``size``...) and
  parameters read directly (``get_attr``) are evaluated where they are needed, so only
  layers' values cross stage boundaries;
* the values crossing the boundary after stage ``k`` are every layer value made in a stage
  ``<= k`` that a stage ``> k`` reads (a ResNet skip, an Inception or DenseNet
  concatenation's inputs): stage ``k`` receives the boundary before it and sends the one
  after it, passing on what it does not use itself. A boundary is a flat tuple of tensors
  (a layer whose value is a tuple, an LSTM's ``(output, (h, c))``, contributes its tensors
  in :mod:`torch.utils._pytree` order).

:class:`StageModule` runs one stage: ``forward(*boundary_in) -> boundary_out`` (the last
stage returns the model's output). Its parameters are the model's own, named by their
qualified names in the model, so ``torch.func.functional_call(stage, weights, inputs)``
runs the stage on other weight versions (PipeDream's stash, SpecTrain's prediction).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch import nn

from realrun.graph import layer_graph, run_nodes, trace_module


@dataclass(frozen=True)
class Crossing:
    """One tensor of a stage boundary: leaf ``leaf`` of fx node ``node``'s value.

    Attributes:
        node: fx node name.
        leaf: index of the tensor among the node value's pytree leaves.
        shape, dtype: of the tensor at the split's micro-batch size.
    """

    node: str
    leaf: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()

    @property
    def differentiable(self) -> bool:
        """Whether a gradient flows back across it (floating point)."""
        return self.dtype.is_floating_point or self.dtype.is_complex


class StageModule(nn.Module):
    """One pipeline stage (see module docs)."""

    def __init__(
        self,
        gm: fx.GraphModule,
        index: int,
        nodes: list[fx.Node],
        inputs: Sequence[Crossing],
        outputs: Sequence[Crossing] | None,
        specs: dict[str, Any],
        leaves: dict[str, list[Any]],
        param_names: Sequence[str],
        layer_of: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        super().__init__()
        self.gm = gm
        self.index = index
        self._nodes = nodes
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs) if outputs is not None else None
        self._specs = specs
        self._leaves = leaves  # non-tensor leaves of crossing values (static)
        self.param_names = tuple(param_names)
        """The stage's parameters by their names in the model (in ``gm`` too)."""
        self.layer_of: dict[str, tuple[str, int]] = dict(layer_of or {})
        """fx node name -> ``(trace layer name, index)`` of the stage's layers."""
        self.on_forward: Callable[[tuple[str, int], float, float], None] | None = None
        """If set, called after each layer's forward with its monotonic start and end."""
        self.on_grad: Callable[[tuple[str, int]], None] | None = None
        """If set, called when the gradient of a layer's output arrives in backward."""

    @property
    def is_last(self) -> bool:
        """Whether this stage ends with the model's output."""
        return self.outputs is None

    def stage_parameters(self) -> list[nn.Parameter]:
        """The stage's parameters, in :attr:`param_names` order."""
        return [self.gm.get_parameter(n) for n in self.param_names]

    def call(self, weights: dict[str, torch.Tensor], *flat: torch.Tensor) -> Any:
        """:meth:`forward` with the parameters in ``weights`` (by their names in the model)
        in place of the module's own (``torch.func.functional_call``); a plain call when
        ``weights`` are the module's own parameters (swapping them in costs time per
        call)."""
        own = self.__dict__.get("_own_params")
        if own is None:
            own = self.__dict__["_own_params"] = dict(
                zip(self.param_names, self.stage_parameters())
            )
        if len(weights) == len(own) and all(weights[n] is t for n, t in own.items()):
            return self(*flat)
        return torch.func.functional_call(self, {f"gm.{n}": t for n, t in weights.items()}, flat)

    def forward(self, *flat: torch.Tensor) -> Any:
        if len(flat) != len(self.inputs):
            raise ValueError(f"stage {self.index}: {len(flat)} inputs, expected {len(self.inputs)}")
        env: dict[str, Any] = {}
        grouped: dict[str, dict[int, torch.Tensor]] = {}
        for c, t in zip(self.inputs, flat):
            grouped.setdefault(c.node, {})[c.leaf] = t
        for name, parts in grouped.items():
            leaves = list(self._leaves[name])
            for i, t in parts.items():
                leaves[i] = t
            env[name] = pytree.tree_unflatten(leaves, self._specs[name])
        by_name = {n.name: n for n in self.gm.graph.nodes}

        def value(n: fx.Node) -> Any:
            if n.name in env:
                return env[n.name]
            if n.op == "get_attr":
                out = self.gm
                for part in str(n.target).split("."):
                    out = getattr(out, part)
            elif n.op == "placeholder":
                raise RuntimeError(
                    f"stage {self.index}: model input {n.name} did not reach this stage"
                )
            else:
                out = _run(self.gm, n, value)
            env[n.name] = out
            return out

        result = None
        on_forward, on_grad = self.on_forward, self.on_grad
        for n in self._nodes:
            if n.op == "output":
                result = fx.node.map_arg(n.args[0], value)
                continue
            layer = self.layer_of.get(n.name)
            if layer is None or (on_forward is None and on_grad is None):
                value(n)
                continue
            t0 = time.monotonic()
            v = value(n)
            if on_forward is not None:
                on_forward(layer, t0, time.monotonic())
            if on_grad is not None:
                for t in pytree.tree_leaves(v):
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        t.register_hook(_grad_hook(on_grad, layer))
        if self.outputs is None:
            return result
        out = []
        for c in self.outputs:
            leaves = pytree.tree_leaves(value(by_name[c.node]))
            out.append(leaves[c.leaf])
        return tuple(out)


def _grad_hook(
    on_grad: Callable[[tuple[str, int]], None], layer: tuple[str, int]
) -> Callable[[torch.Tensor], None]:
    def hook(_g: torch.Tensor) -> None:
        on_grad(layer)

    return hook


def _run(gm: fx.GraphModule, n: fx.Node, value: Any) -> Any:
    args = fx.node.map_arg(n.args, value)
    kwargs = fx.node.map_arg(n.kwargs, value)
    if n.op == "call_module":
        return gm.get_submodule(str(n.target))(*args, **kwargs)
    if n.op == "call_function":
        return n.target(*args, **kwargs)
    if n.op == "call_method":
        obj, *rest = args
        return getattr(obj, str(n.target))(*rest, **kwargs)
    raise RuntimeError(f"cannot run fx node {n.name} ({n.op})")


@dataclass
class Split:
    """A model split into stages.

    Attributes:
        stages: one module per stage.
        boundaries: the tensors crossing after stage ``k`` (``k < len(stages) - 1``).
    """

    stages: list[StageModule]
    boundaries: list[tuple[Crossing, ...]]


def split_model(
    model: nn.Module,
    stage_layers: Sequence[Sequence[int]],
    example_inputs: tuple[Any, ...],
    layer_names: Sequence[str] | None = None,
) -> Split:
    """Cut ``model`` into stages (see module docs). ``stage_layers`` are the trace layer
    indices of each stage (a :class:`~simcore.partition.Partition`'s ``stages[k].layers``),
    ``example_inputs`` a micro-batch of inputs (``meta`` works) that fixes the boundary
    tensors' shapes, ``layer_names`` the trace's names to check against."""
    meta_inputs = tuple(t.to("meta") if isinstance(t, torch.Tensor) else t for t in example_inputs)
    meta = _meta_copy(model)
    graph = layer_graph(meta, meta_inputs)
    if layer_names is not None and tuple(layer_names) != tuple(x.name for x in graph.layers):
        raise ValueError("the trace's layers are not the model's (different names or order)")
    gm = trace_module(model)
    nodes = {n.name: n for n in gm.graph.nodes}
    values = run_nodes(trace_module(meta), meta_inputs)
    n_stages = len(stage_layers)
    stage_of: dict[str, int] = {}
    for k, idx in enumerate(stage_layers):
        for i in idx:
            stage_of[graph.layers[i].node.name] = k
    for layer in graph.layers:
        if layer.node.name not in stage_of:
            raise ValueError(f"layer {layer.name} is in no stage")
    # layer nodes each node reads, through folded nodes
    deps: dict[str, set[str]] = {}
    for n in gm.graph.nodes:
        d: set[str] = set()
        for i in n.all_input_nodes:
            if i.name in stage_of:
                d.add(i.name)
            else:
                d |= deps[i.name]
        deps[n.name] = d
    output = next(n for n in gm.graph.nodes if n.op == "output")
    stage_of_all = dict(stage_of)
    stage_of_all[output.name] = n_stages - 1
    # crossings: layer node L (stage s) read by a consumer in stage t > s crosses s..t-1
    last_use: dict[str, int] = {}
    for name, st in stage_of_all.items():
        for d in deps[name]:
            last_use[d] = max(last_use.get(d, -1), st)
    specs: dict[str, Any] = {}
    leaves: dict[str, list[Any]] = {}
    crossing_nodes: list[list[str]] = [[] for _ in range(n_stages - 1)]
    for n in gm.graph.nodes:
        if n.name not in stage_of or last_use.get(n.name, -1) <= stage_of[n.name]:
            continue
        for k in range(stage_of[n.name], last_use[n.name]):
            crossing_nodes[k].append(n.name)
        flat, spec = pytree.tree_flatten(values[n.name])
        specs[n.name] = spec
        leaves[n.name] = [None if isinstance(v, torch.Tensor) else v for v in flat]
    boundaries: list[tuple[Crossing, ...]] = []
    for k in range(n_stages - 1):
        out = []
        for name in crossing_nodes[k]:
            flat = pytree.tree_leaves(values[name])
            for j, v in enumerate(flat):
                if isinstance(v, torch.Tensor):
                    out.append(Crossing(name, j, tuple(v.shape), v.dtype))
        boundaries.append(tuple(out))
    params_of: list[list[str]] = [[] for _ in range(n_stages)]
    for layer in graph.layers:
        params_of[stage_of[layer.node.name]].extend(layer.param_names)
    placeholders = tuple(
        Crossing(n.name, 0, tuple(values[n.name].shape), values[n.name].dtype)
        for n in gm.graph.nodes
        if n.op == "placeholder"
    )
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            specs[n.name] = pytree.tree_flatten(values[n.name])[1]
            leaves[n.name] = [None]
    layer_of = {
        layer.node.name: (layer.name, i)
        for i, layer in enumerate(graph.layers)
        if layer.kind != "input"
    }
    stages = []
    for k in range(n_stages):
        own = [nodes[n.name] for n in gm.graph.nodes if stage_of_all.get(n.name) == k]
        stages.append(
            StageModule(
                gm,
                k,
                own,
                boundaries[k - 1] if k else placeholders,
                boundaries[k] if k < n_stages - 1 else None,
                specs,
                leaves,
                params_of[k],
                layer_of,
            )
        )
    _check_params(gm, stages)
    return Split(stages, boundaries)


def _meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the meta device (same structure, no storage)."""
    import copy

    return copy.deepcopy(model).to("meta")


def _check_params(gm: fx.GraphModule, stages: list[StageModule]) -> None:
    seen: dict[str, int] = {}
    for st in stages:
        for n in st.param_names:
            if n in seen:
                raise ValueError(f"parameter {n} belongs to stages {seen[n]} and {st.index}")
            seen[n] = st.index
    missing = {n for n, p in gm.named_parameters() if p.requires_grad} - set(seen)
    if missing:
        raise ValueError(f"parameters in no stage: {sorted(missing)[:5]}")


class SavedBytes:
    """Counts the bytes autograd saves while active (saved-tensor hooks), each storage
    once, leaving out the storages of ``held`` (tensors held anyway: the weights, the
    stage's inputs, counted apart)."""

    def __init__(self, held: Iterable[torch.Tensor] = ()) -> None:
        self.nbytes = 0
        self._seen: set[int] = {t.untyped_storage().data_ptr() for t in held}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """The pack hook: count ``t``'s storage if it is new, keep ``t`` as it is."""
        try:
            ptr = t.untyped_storage().data_ptr()
        except RuntimeError:
            return t
        if ptr not in self._seen:
            self._seen.add(ptr)
            self.nbytes += t.untyped_storage().nbytes()
        return t

    def hooks(self) -> Any:
        """The context manager that counts while it is active."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
