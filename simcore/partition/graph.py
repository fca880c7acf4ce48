"""The layer graph the partitioner works on, derived from a :class:`~traces.model.Trace`.

PipeDream's optimizer prepares a profile in two ways before it partitions it, and we do
the same so that results can be compared with it:

* **Input nodes** (``kind == "input"``, PipeDream's ``Input*`` sources: data loading)
  take no part in the search; they are put back into stage 0 afterwards.
* **Unused tuple outputs**: sinks whose operator is ``__getitem__`` select an element of
  a layer's output tuple that nothing consumes (an LSTM's final state, for example). They
  are dropped from the search and put into the stage of their producer afterwards.

Everything else keeps the trace's topological order; node ``i`` of the graph is
``layers[i]`` of the trace. Per node: compute seconds (forward + backward, whole profiled
batch), parameter bytes and output activation bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.model import Trace


class PartitionError(ValueError):
    """The partitioner cannot do what was asked (too few layers, nothing fits in memory,
    a graph too large to search). The message says what and what would work."""


@dataclass(frozen=True)
class PartitionGraph:
    """A trace's layer DAG prepared for partitioning (see module docs).

    Attributes:
        trace: the trace it comes from.
        layer: trace layer index of each node (nodes are in topological order).
        compute_s: forward plus backward seconds of each node.
        param_bytes: parameter bytes of each node.
        activation_bytes: output activation bytes of each node.
        succ, pred: direct successors / predecessors of each node (node indices).
        inputs: trace indices of the input layers (placed in stage 0).
        detached: ``(trace index, node it belongs with)`` of the dropped unused-output
            sinks (each goes into the stage of that node).
    """

    trace: Trace
    layer: tuple[int, ...]
    compute_s: tuple[float, ...]
    param_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    succ: tuple[tuple[int, ...], ...]
    pred: tuple[tuple[int, ...], ...]
    inputs: tuple[int, ...]
    detached: tuple[tuple[int, int], ...]

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.layer)

    @property
    def total_compute_s(self) -> float:
        """Compute seconds of the whole model (one GPU, one batch)."""
        return sum(self.compute_s)

    @property
    def total_param_bytes(self) -> int:
        """Parameter bytes of the whole model."""
        return sum(self.param_bytes)

    def sources(self) -> list[int]:
        """Nodes without predecessors, in order."""
        return [v for v in range(self.n) if not self.pred[v]]

    def boundary_bytes(self, inside: set[int] | frozenset[int]) -> int:
        """Activation bytes that leave the node set ``inside`` (outputs of its nodes that a
        node outside consumes): what crosses a stage boundary after it."""
        return sum(
            self.activation_bytes[v] for v in inside if any(s not in inside for s in self.succ[v])
        )


def prepare(trace: Trace) -> PartitionGraph:
    """The :class:`PartitionGraph` of ``trace`` (see module docs); ``PartitionError`` if
    no layer is left to partition."""
    layers = trace.layers
    succ_all = trace.successors
    inputs = tuple(i for i, layer in enumerate(layers) if layer.kind == "input")
    skip = set(inputs)
    detached = []
    for i, layer in enumerate(layers):
        if i in skip or not layer.op.startswith("__getitem__"):
            continue
        if not any(d not in skip for d in succ_all[i]):
            producers = [p for p in trace.predecessors[i] if p not in skip]
            if producers:
                detached.append((i, max(producers)))
    dropped = skip | {i for i, _ in detached}
    keep = [i for i in range(len(layers)) if i not in dropped]
    if not keep:
        raise PartitionError(f"model {trace.meta.model!r} has no layers to partition")
    pos = {t: v for v, t in enumerate(keep)}
    succ = tuple(tuple(pos[d] for d in succ_all[t] if d in pos) for t in keep)
    pred_l: list[list[int]] = [[] for _ in keep]
    for v, ss in enumerate(succ):
        for s in ss:
            pred_l[s].append(v)
    return PartitionGraph(
        trace=trace,
        layer=tuple(keep),
        compute_s=tuple(layers[t].forward_s + layers[t].backward_s for t in keep),
        param_bytes=tuple(layers[t].param_bytes for t in keep),
        activation_bytes=tuple(layers[t].activation_bytes for t in keep),
        succ=succ,
        pred=tuple(tuple(p) for p in pred_l),
        inputs=inputs,
        detached=tuple((t, pos[p]) for t, p in detached),
    )
