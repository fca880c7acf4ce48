"""Pipeline partitioning: split a layer graph into stages (optionally replicated) so that
the slowest stage is as fast as possible.

``partition(trace, gpus, bandwidth_bytes_per_s, method=...)`` returns a
:class:`Partition`. Methods:

* ``antichain``: PipeDream's optimizer (docs/schemes.md, section 9): the dynamic programme
  over the antichain DAG's states, with replicated stages unless ``straight``; see
  :mod:`simcore.partition.optimize` for the cost model and how it is made fast.
* ``layers``, ``params``, ``compute``: baselines; a straight pipeline over the trace's
  topological order, cut so that each stage has about the same number of layers,
  parameter bytes or compute time.

``cuts`` (names of the first layer of every stage but the first) gives the stages instead
of any method: a straight pipeline cut there (method ``given``). That is how a run is
simulated on the stages another run used, whatever its own layer times would choose.

Every method's stages are timed with the same cost model, so bottlenecks and predicted
speedups compare directly. The speedup over data parallelism uses the same weight
synchronisation term as the DP: ``(C + 4(N-1) P/(N B)) / N`` per batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from simcore.partition.antichain import (
    DEFAULT_MAX_STATES,
    States,
    antichain_states,
    chain_states,
)
from simcore.partition.graph import PartitionError, PartitionGraph, prepare
from simcore.partition.optimize import CostModel, replica_work_s, solve
from traces.model import Trace

METHODS = ("antichain", "layers", "params", "compute")
"""Partitioning methods (``--partition`` / ``sim partition --method``)."""


@dataclass(frozen=True)
class Stage:
    """One pipeline stage.

    Attributes:
        layers: trace layer indices, in topological order.
        replicas: GPUs running the stage (data parallel among themselves).
        compute_s: forward plus backward seconds of its layers for the whole batch.
        forward_s, backward_s: the two parts of ``compute_s``.
        param_bytes: parameter bytes of its layers.
        activation_bytes: output activation bytes of all its layers (kept for backward).
        out_bytes: activation bytes crossing from this and earlier stages to later ones,
            and the model's inputs that a later stage reads (0 for the last stage).
        time_s: seconds per batch under the cost model (compute over replicas plus
            weight synchronisation, and activation transfers when counted).
    """

    layers: tuple[int, ...]
    replicas: int
    compute_s: float
    forward_s: float
    backward_s: float
    param_bytes: int
    activation_bytes: int
    out_bytes: int
    time_s: float


@dataclass(frozen=True)
class Partition:
    """A pipeline partition and what the cost model predicts for it.

    Attributes:
        method: one of :data:`METHODS`.
        gpus: GPUs used (the sum of the stages' replicas).
        straight: whether replication was allowed.
        bandwidth_bytes_per_s: bandwidth of the cost model.
        stages: the stages, first to last.
        bottleneck_s: the slowest stage's ``time_s``.
        single_gpu_s: the whole model on one GPU (compute seconds per batch).
        data_parallel_s: per-batch time of data parallelism on ``gpus`` GPUs.
        states: antichain states searched (0 for the baselines).
        exact: ``False`` when the graph had too many states and the search ran over the
            prefixes of one topological order instead.
        activation_term: whether activation transfers were counted.
        pairs: (state, state) pairs the search evaluated.
        wall_s: seconds the partitioner took.
    """

    method: str
    gpus: int
    straight: bool
    bandwidth_bytes_per_s: float
    stages: tuple[Stage, ...]
    bottleneck_s: float
    single_gpu_s: float
    data_parallel_s: float
    states: int = 0
    exact: bool = True
    activation_term: bool = False
    pairs: int = 0
    wall_s: float = 0.0
    model: str = ""
    layer_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def speedup_vs_1gpu(self) -> float:
        """Throughput over one GPU: ``single_gpu_s / bottleneck_s``."""
        return self.single_gpu_s / self.bottleneck_s if self.bottleneck_s > 0 else float("inf")

    @property
    def speedup_vs_dp(self) -> float:
        """Throughput over data parallelism on the same GPUs."""
        return self.data_parallel_s / self.bottleneck_s if self.bottleneck_s > 0 else float("inf")

    @property
    def replicas(self) -> tuple[int, ...]:
        """Replicas of each stage."""
        return tuple(s.replicas for s in self.stages)

    def stage_of_layer(self) -> dict[int, int]:
        """Trace layer index -> stage index."""
        return {layer: k for k, s in enumerate(self.stages) for layer in s.layers}

    def to_dict(self) -> dict[str, Any]:
        """The ``sim partition --json`` object."""
        names = self.layer_names
        return {
            "model": self.model,
            "method": self.method,
            "gpus": self.gpus,
            "straight": self.straight,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "activation_term": self.activation_term,
            "stages": [
                {
                    "layers": [names[i] if names else i for i in s.layers],
                    "replicas": s.replicas,
                    "compute_s": s.compute_s,
                    "time_s": s.time_s,
                    "param_bytes": s.param_bytes,
                    "out_bytes": s.out_bytes,
                }
                for s in self.stages
            ],
            "replicas": list(self.replicas),
            "bottleneck_s": self.bottleneck_s,
            "single_gpu_s": self.single_gpu_s,
            "data_parallel_s": self.data_parallel_s,
            "speedup_vs_1gpu": self.speedup_vs_1gpu,
            "speedup_vs_dp": self.speedup_vs_dp,
            "states": self.states,
            "exact": self.exact,
            "wall_s": self.wall_s,
        }


def partition(
    trace: Trace,
    gpus: int,
    bandwidth_bytes_per_s: float,
    *,
    method: str = "antichain",
    straight: bool = False,
    activation_term: bool = False,
    memory_limit_bytes: float | None = None,
    optimizer_copies: int = 1,
    max_states: int = DEFAULT_MAX_STATES,
    cuts: Sequence[str] | None = None,
) -> Partition:
    """Partition ``trace`` over exactly ``gpus`` GPUs (see module docs), or cut it where
    ``cuts`` says (:func:`given_groups`).

    ``bandwidth_bytes_per_s`` prices weight synchronisation among replicas and, with
    ``activation_term``, transfers between stages. ``memory_limit_bytes`` bounds each
    GPU's memory (antichain method only; see :class:`CostModel`). Raises
    :class:`PartitionError` when it cannot be done.
    """
    t0 = time.perf_counter()
    if method not in METHODS:
        raise PartitionError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if gpus < 1:
        raise PartitionError(f"gpus must be at least 1, got {gpus}")
    if not bandwidth_bytes_per_s > 0:
        raise PartitionError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    g = prepare(trace)
    cm = CostModel(
        gpus,
        bandwidth_bytes_per_s,
        straight or method != "antichain",
        activation_term,
        memory_limit_bytes,
        optimizer_copies,
    )
    states = 0
    exact = True
    pairs = 0
    if cuts:
        groups = given_groups(g, cuts, gpus)
        reps = [1] * gpus
        method = "given"
    elif method == "antichain":
        try:
            st: States = antichain_states(g, max_states)
        except PartitionError:
            st = chain_states(g)
            exact = False
        sol = solve(g, st, cm)
        states, pairs = st.count, sol.pairs
        groups, prev = [], frozenset()
        for b in sol.bounds:
            cur = st.nodes(b)
            groups.append(sorted(cur - prev))
            prev = cur
        reps = list(sol.replicas)
    else:
        groups = baseline_groups(g, gpus, method)
        reps = [1] * gpus
    stages = build_stages(g, groups, reps, cm)
    total_p = g.total_param_bytes
    dp = replica_work_s(g.total_compute_s, total_p, gpus, bandwidth_bytes_per_s) / gpus
    return Partition(
        method=method,
        gpus=gpus,
        straight=cm.straight,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        stages=stages,
        bottleneck_s=max(s.time_s for s in stages),
        single_gpu_s=g.total_compute_s,
        data_parallel_s=dp,
        states=states,
        exact=exact,
        activation_term=activation_term,
        pairs=pairs,
        wall_s=time.perf_counter() - t0,
        model=trace.meta.model,
        layer_names=tuple(layer.name for layer in trace.layers),
    )


def baseline_groups(g: PartitionGraph, gpus: int, method: str) -> list[list[int]]:
    """Nodes per stage for a baseline: consecutive runs of the topological order with
    about equal layer count, parameter bytes or compute time."""
    n = g.n
    if n < gpus:
        raise PartitionError(f"{n} layers cannot make {gpus} non-empty stages")
    if method == "layers":
        weights = [1.0] * n
    elif method == "params":
        weights = [float(p) for p in g.param_bytes]
    else:
        weights = list(g.compute_s)
    cuts = balanced_cuts(weights, gpus)
    bounds = [0, *cuts, n]
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def given_groups(g: PartitionGraph, cuts: Sequence[str], gpus: int) -> list[list[int]]:
    """Nodes per stage of a straight pipeline over the topological order, cut before the
    layers named in ``cuts`` (one name per stage after the first, in order)."""
    names = [g.trace.layers[g.layer[v]].name for v in range(g.n)]
    if len(cuts) != gpus - 1:
        raise PartitionError(
            f"{len(cuts)} stage cut(s) {','.join(cuts)!r} make {len(cuts) + 1} stages, "
            f"not {gpus}: give the first layer of each of stages 2..{gpus}"
        )
    where = {name: v for v, name in enumerate(names)}
    bounds = [0]
    for name in cuts:
        v = where.get(name)
        if v is None or v == 0:
            raise PartitionError(
                f"stage cut {name!r} is not a layer that can start a stage; "
                f"layers: {', '.join(names[1:])}"
            )
        if v <= bounds[-1]:
            raise PartitionError(
                f"stage cut {name!r} does not come after the previous cut "
                "(give the cuts in the layers' order)"
            )
        bounds.append(v)
    bounds.append(g.n)
    return [list(range(a, b)) for a, b in itertools.pairwise(bounds)]


def balanced_cuts(weights: list[float], parts: int) -> list[int]:
    """Cut positions ``0 < c1 < ... < c_{parts-1} < len(weights)`` that bring each
    prefix sum closest to ``i/parts`` of the total (every part non-empty)."""
    n = len(weights)
    cum = [0.0]
    for w in weights:
        cum.append(cum[-1] + w)
    total = cum[-1]
    cuts: list[int] = []
    prev = 0
    for i in range(1, parts):
        target = total * i / parts
        lo, hi = prev + 1, n - (parts - i)
        best = min(range(lo, hi + 1), key=lambda c: (abs(cum[c] - target), c))
        cuts.append(best)
        prev = best
    return cuts


def build_stages(
    g: PartitionGraph, groups: list[list[int]], replicas: list[int], cm: CostModel
) -> tuple[Stage, ...]:
    """Stages from node groups: input layers go to the first stage, dropped
    unused-output sinks to their producer's, and each stage is timed; a stage's output
    bytes are the activations a later stage reads and the inputs a later stage reads."""
    trace = g.trace
    members = [[g.layer[v] for v in grp] for grp in groups]
    stage_of = {v: k for k, grp in enumerate(groups) for v in grp}
    members[0].extend(g.inputs)
    for t, owner in g.detached:
        members[stage_of[owner]].append(t)
    # an input read beyond the first stage travels with the activations up to its last
    # reader (the model's inputs all enter in stage 0)
    stage_of_layer = {t: k for k, mem in enumerate(members) for t in mem}
    input_until = {
        t: max((stage_of_layer.get(s, 0) for s in trace.successors[t]), default=0) for t in g.inputs
    }
    out: list[Stage] = []
    seen: set[int] = set()
    prev_out = 0
    for k, (grp, mem) in enumerate(zip(groups, members)):
        seen.update(grp)
        layers = [trace.layers[t] for t in mem]
        fwd = sum(x.forward_s for x in layers if x.kind != "input")
        bwd = sum(x.backward_s for x in layers if x.kind != "input")
        params = sum(x.param_bytes for x in layers)
        acts = sum(x.activation_bytes for x in layers if x.kind != "input")
        out_b = 0
        if k < len(groups) - 1:
            out_b = g.boundary_bytes(seen) + sum(
                trace.layers[t].activation_bytes for t, last in input_until.items() if last > k
            )
        comp = sum(g.compute_s[v] for v in grp)
        t = cm.stage_time(
            comp, float(sum(g.param_bytes[v] for v in grp)), replicas[k], prev_out, out_b
        )
        out.append(
            Stage(tuple(sorted(mem)), replicas[k], fwd + bwd, fwd, bwd, params, acts, out_b, t)
        )
        prev_out = out_b
    return tuple(out)


__all__ = [
    "METHODS",
    "CostModel",
    "Partition",
    "PartitionError",
    "PartitionGraph",
    "Stage",
    "partition",
    "prepare",
]
