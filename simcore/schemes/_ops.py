"""A worker's compute ops, grouped into the runs it can queue at once.

A data-parallel worker only has to wake up where something happens between two layers:
where a gradient becomes ready for communication in backward, or where forward may have
to wait for values. Everything in between is queued with one
:meth:`~simcore.device.Gpu.compute_seq` call (one event, the same times and spans as
layer-by-layer issue). This module builds those runs from a trace, once per iteration
number, shared by all ranks.
"""

from __future__ import annotations

from collections.abc import Callable

from simcore.device import Run
from simcore.records import BACKWARD, FORWARD
from traces.model import Trace

Op = tuple[float, str, str, int, int, int]
"""``(duration_s, kind, name, iteration, layer, microbatch)``: the arguments of
:meth:`~simcore.device.Gpu.compute`."""


class LayerOps:
    """Forward and backward ops of the layers that run (input nodes do not).

    Attributes:
        fwd: ``(forward_s, name, layer)`` in forward order.
        bwd: ``(backward_s, name, layer)`` in backward (reverse) order.
    """

    def __init__(self, trace: Trace) -> None:
        run = [i for i, layer in enumerate(trace.layers) if layer.kind != "input"]
        self.fwd = [(trace.layers[i].forward_s, trace.layers[i].name, i) for i in run]
        self.bwd = [(trace.layers[i].backward_s, trace.layers[i].name, i) for i in reversed(run)]
        self._cache: dict[tuple[str, int], list[tuple[int, list[Op]]]] = {}

    def forward_runs(
        self, it: int, wait_before: Callable[[int], bool]
    ) -> list[tuple[int, list[Op]]]:
        """Forward of iteration ``it`` as ``(layer, ops)`` runs, a new run starting at
        every layer for which ``wait_before(layer)`` holds (``layer`` is that layer, or
        -1 for a first run that needs no wait). Cached per iteration: pass the same
        predicate every time."""
        return self._runs("f", it, self.fwd, FORWARD, wait_before, before=True)

    def backward_runs(
        self, it: int, ready_after: Callable[[int], bool]
    ) -> list[tuple[int, list[Op]]]:
        """Backward of iteration ``it`` as ``(layer, ops)`` runs, each ending with a layer
        for which ``ready_after(layer)`` holds (``layer`` is that layer, or -1 for a last
        run that ends with none). Cached per iteration."""
        return self._runs("b", it, self.bwd, BACKWARD, ready_after, before=False)

    def _runs(
        self,
        key: str,
        it: int,
        layers: list[tuple[float, str, int]],
        kind: str,
        cut: Callable[[int], bool],
        before: bool,
    ) -> list[tuple[int, list[Op]]]:
        hit = self._cache.get((key, it))
        if hit is not None:
            return hit
        runs: list[tuple[int, list[Op]]] = []
        mark, ops = -1, []
        for dur, name, i in layers:
            if before and cut(i):
                if ops or mark >= 0:
                    runs.append((mark, ops))
                mark, ops = i, []
            ops.append((dur, kind, name, it, i, -1))
            if not before and cut(i):
                runs.append((i, ops))
                ops = []
        if ops or (before and mark >= 0):
            runs.append((mark, ops))
        runs = [(mark, Run(it, ops)) for mark, ops in runs]
        self._cache[(key, it)] = runs
        return runs
