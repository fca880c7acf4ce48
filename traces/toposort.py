"""Building a :class:`~traces.model.Trace` from layers and named edges in any order."""

from __future__ import annotations

import heapq

from traces.model import Layer, Trace, TraceMeta


def sort_layers(meta: TraceMeta, layers: list[Layer], edges: list[tuple[str, str]]) -> Trace:
    """Order ``layers`` topologically (Kahn's algorithm; among ready layers the one listed
    first wins, so an already sorted list keeps its order) and return the trace.

    Raises ``ValueError`` naming a layer on a cycle if the graph is not acyclic.
    """
    index = {layer.name: i for i, layer in enumerate(layers)}
    succ: list[set[int]] = [set() for _ in layers]
    indeg = [0] * len(layers)
    for s, d in edges:
        si, di = index[s], index[d]
        if si == di:
            raise ValueError(f"layer {s!r} has an edge to itself")
        if di not in succ[si]:
            succ[si].add(di)
            indeg[di] += 1
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(layers):
        stuck = next(layers[i].name for i, k in enumerate(indeg) if k > 0)
        raise ValueError(f"the layer graph has a cycle through {stuck!r}")
    pos = {old: new for new, old in enumerate(order)}
    new_edges = sorted({(pos[index[s]], pos[index[d]]) for s, d in edges})
    return Trace(meta, tuple(layers[i] for i in order), tuple(new_edges))
