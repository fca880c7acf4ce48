"""The layer graph of a torch model, from ``torch.fx``.

:func:`layer_graph` traces a module symbolically at leaf-module granularity (every
``torch.nn`` module such as ``Conv2d``, ``BatchNorm2d`` or ``LSTM`` is one node) and runs it
once on example inputs to learn what every node produces. The nodes become layers:

* ``call_module`` nodes (leaf modules) and the functional tensor ops between them
  (``add``, ``cat``, ``flatten``, ``bmm``, a tensor slice...) are layers of kind ``"layer"``,
  so residual sums and concatenations are joins of the graph;
* placeholders (the model's inputs) are layers of kind ``"input"``;
* nodes that only pick things apart (``getitem`` on a tuple such as an LSTM's
  ``(output, state)``, ``getattr``, ``size``: anything that does not produce a tensor) are
  folded away: edges pass through them;
* parameters read directly (``get_attr``) are charged to the first layer that reads them.

Layer names are the modules' qualified names (``layer1.0.conv1``; a module called a second
time gets ``#2``) and fx's node names for functional ops (``add_3``, ``cat``). The same
names are used by the profiler, the Kineto recorder (:mod:`realrun.kineto`) and so by the
traces they write.
"""

from __future__ import annotations

import builtins
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn


@dataclass(frozen=True)
class LayerNode:
    """One layer of the graph.

    Attributes:
        name: the layer's name in traces.
        node: the fx node it comes from.
        kind: ``"layer"`` or ``"input"``.
        op: a description (``Conv2d(3, 64, kernel_size=(7, 7), ...)``, ``add``).
        preds: names of the layers it reads from, in argument order.
        param_bytes: bytes of the trainable parameters it owns (each counted once).
        activation_bytes: bytes of its output for the example batch.
        needs_grad: whether its output takes part in backward (depends on parameters).
        param_names: qualified names (in the traced module, the same as in the model) of
            the parameters counted in ``param_bytes``, in the order they are charged.
    """

    name: str
    node: fx.Node
    kind: str
    op: str
    preds: tuple[str, ...]
    param_bytes: int
    activation_bytes: int
    needs_grad: bool
    param_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class LayerGraph:
    """The traced module, its layers in forward (topological) order, each fx node's value
    from the example run (``values``, by node name) and the names of the fx nodes whose
    output depends on trainable parameters (``grad_nodes``: backward flows through them)."""

    module: fx.GraphModule
    layers: tuple[LayerNode, ...]
    values: dict[str, Any]
    grad_nodes: frozenset[str]

    @property
    def edges(self) -> list[tuple[str, str]]:
        """``(src, dst)`` layer-name pairs, one per distinct data dependency."""
        out: list[tuple[str, str]] = []
        for layer in self.layers:
            for p in dict.fromkeys(layer.preds):
                out.append((p, layer.name))
        return out

    def layer(self, name: str) -> LayerNode:
        """The layer called ``name`` (``KeyError`` if absent)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a value made of tensors, tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def nbytes(value: Any) -> int:
    """Bytes of all tensors in ``value`` (works on the meta device)."""
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def used_output(n: fx.Node, value: Any) -> list[torch.Tensor]:
    """The tensors of node ``n``'s output ``value`` that later nodes read: all of them,
    except that for a tuple read only through ``getitem`` (an LSTM's ``(output, state)``),
    only the items read."""
    if isinstance(value, torch.Tensor) or not isinstance(value, list | tuple):
        return list(tensors_in(value))
    picked: dict[int, None] = {}
    for user in n.users:
        if (
            user.op == "call_function"
            and user.target is operator.getitem
            and isinstance(user.args[1], int)
        ):
            picked[user.args[1]] = None
        else:
            return list(tensors_in(value))
    return [t for i in picked for t in tensors_in(value[i])]


class _LeafTracer(fx.Tracer):
    """fx's tracer, which also keeps a module with a true ``fx_leaf`` attribute (an
    emulated device's layer, :mod:`realrun.emudevice`) as one node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return bool(getattr(m, "fx_leaf", False)) or super().is_leaf_module(
            m, module_qualified_name
        )


def trace_module(model: nn.Module) -> fx.GraphModule:
    """``torch.fx`` trace of ``model`` at leaf-module granularity (torch's own modules and
    those marked ``fx_leaf``), dead code removed."""
    tracer = _LeafTracer()
    graph = tracer.trace(model)
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def run_nodes(gm: fx.GraphModule, inputs: tuple[Any, ...]) -> dict[str, Any]:
    """Run ``gm`` on ``inputs`` without autograd and return every node's value by name."""
    values: dict[str, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            out = super().run_node(n)
            values[n.name] = out
            return out

    with torch.no_grad():
        _Recorder(gm).run(*inputs)
    return values


def layer_graph(model: nn.Module, inputs: tuple[Any, ...]) -> LayerGraph:
    """Trace ``model`` and run it once on ``inputs`` (any device, ``meta`` included) to
    build its :class:`LayerGraph` (see the module docs for what becomes a layer)."""
    gm = trace_module(model)
    values = run_nodes(gm, inputs)
    return _build(gm, values)


def is_layer_node(n: fx.Node, values: dict[str, Any]) -> bool:
    """Whether fx node ``n`` becomes a layer (rather than being folded away)."""
    if n.op == "placeholder":
        return any(True for _ in tensors_in(values.get(n.name)))
    if n.op not in ("call_module", "call_function", "call_method"):
        return False
    if n.op == "call_function" and n.target is builtins.getattr:
        return False
    if n.op == "call_function" and n.target is operator.getitem:
        src = n.args[0]
        if not (isinstance(src, fx.Node) and isinstance(values.get(src.name), torch.Tensor)):
            return False
    return any(True for _ in tensors_in(values.get(n.name)))


def _build(gm: fx.GraphModule, values: dict[str, Any]) -> LayerGraph:
    names: dict[str, str] = {}  # fx node name -> layer name (layers only)
    sources: dict[str, tuple[str, ...]] = {}  # fx node name -> layer names it carries
    grad: dict[str, bool] = {}  # fx node name -> output depends on parameters
    pending_params: dict[str, list[str]] = {}  # node -> names of parameters not charged
    seen_params: set[int] = set()
    calls: dict[str, int] = {}
    used_names: set[str] = set()
    layers: list[LayerNode] = []
    for n in gm.graph.nodes:
        ins = n.all_input_nodes
        if n.op == "get_attr":
            attr = _fetch_attr(gm, str(n.target))
            is_param = isinstance(attr, nn.Parameter) and attr.requires_grad
            grad[n.name] = is_param
            if is_param and id(attr) not in seen_params:
                seen_params.add(id(attr))
                pending_params[n.name] = [str(n.target)]
            sources[n.name] = ()
            continue
        own_grad = False
        charged: list[str] = []
        if n.op == "call_module":
            mod = gm.get_submodule(str(n.target))
            for pname, p in mod.named_parameters():
                if p.requires_grad:
                    own_grad = True
                    if id(p) not in seen_params:
                        seen_params.add(id(p))
                        charged.append(f"{n.target}.{pname}")
        for i in ins:
            charged.extend(pending_params.pop(i.name, ()))
        param_bytes = sum(nbytes(gm.get_parameter(q)) for q in charged)
        grad[n.name] = own_grad or any(grad.get(i.name, False) for i in ins)
        if n.op == "output" or not is_layer_node(n, values):
            sources[n.name] = tuple(dict.fromkeys(s for i in ins for s in sources[i.name]))
            if charged:  # a folded node passes parameters on to its consumer
                pending_params[n.name] = charged
            continue
        name = _layer_name(n, calls, used_names)
        names[n.name] = name
        sources[n.name] = (name,)
        layers.append(
            LayerNode(
                name=name,
                node=n,
                kind="input" if n.op == "placeholder" else "layer",
                op=_describe(gm, n),
                preds=tuple(dict.fromkeys(s for i in ins for s in sources[i.name])),
                param_bytes=param_bytes,
                activation_bytes=nbytes(used_output(n, values[n.name])),
                needs_grad=grad[n.name],
                param_names=tuple(charged),
            )
        )
    return LayerGraph(gm, tuple(layers), values, frozenset(k for k, v in grad.items() if v))


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _layer_name(n: fx.Node, calls: dict[str, int], used: set[str]) -> str:
    base = str(n.target) if n.op == "call_module" else n.name
    calls[base] = calls.get(base, 0) + 1
    name = base if calls[base] == 1 else f"{base}#{calls[base]}"
    while name in used:
        name += "'"
    used.add(name)
    return name


def _describe(gm: fx.GraphModule, n: fx.Node) -> str:
    if n.op == "placeholder":
        return f"Input {n.name}"
    if n.op == "call_module":
        mod = gm.get_submodule(str(n.target))
        extra = mod.extra_repr()
        return f"{type(mod).__name__}({extra})" if extra else type(mod).__name__
    return re.sub(r"_\d+$", "", n.name)
