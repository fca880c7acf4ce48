"""The dynamic programme over antichain states (PipeDream's optimizer, exactly), fast.

Notation: states are down-sets of the layer graph, ``C(j)`` and ``P(j)`` their cumulative
compute seconds and parameter bytes, ``B`` the inter-stage bandwidth (bytes/s). A stage
from state ``k`` to state ``j`` (``k`` strictly inside ``j``) replicated on ``r`` GPUs
takes, per batch,

    T(k, j, r) = (C(j) - C(k) + 4 (r-1) (P(j) - P(k)) / (r B)) / r

(its compute split over the replicas, plus the data-parallel weight synchronisation among
them), and, with the activation term on, at least ``2 act(k) / (r B)`` and, unless ``j``
is the whole model, ``2 act(j) / (r B)`` (activations in and gradients out, or the other
way round; ``act`` is what crosses the boundary). The best pipeline over exactly ``u``
GPUs up to state ``j`` is

    A(j, u) = min( T(empty, j, u),                              one stage on u GPUs
                   min over k inside j, r < u of max(A(k, u-r), T(k, j, r)) )

and the answer is ``A(everything, N)``; a straight pipeline allows ``r = 1`` only (and a
single-stage prefix only on one GPU), so it has exactly N stages.

The reference evaluates every pair of states. Two facts let us evaluate only a few:

* every stage costs at least its compute over its replicas, so in a pipeline no slower
  than ``U`` the prefix that uses ``u`` GPUs holds between ``C(all) - (N-u) U`` and
  ``u U`` seconds of compute: only states in that *window* can end it;
* so the search runs with a bound ``U`` slightly above the lower bound ``C(all)/N``: if
  the best pipeline found is no slower than ``U``, no pipeline outside the windows can
  beat it and it is optimal; otherwise ``U`` grows and the search repeats. Near a
  balanced optimum the windows are narrow and hold a small fraction of the states.

Within the windows the pairs are evaluated with numpy, inclusion by bitset words. Ties
are broken deterministically: the single-stage option first, then fewer replicas for the
last stage, then the earliest state in enumeration order (PipeDream breaks them by set
iteration order, so split points may differ where several are equally good; bottleneck
times agree).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simcore.partition.antichain import States, chain_states
from simcore.partition.graph import PartitionError, PartitionGraph

DENSE_STATES = 3000
"""Up to this many states the windowed search is used; above, the narrowed one."""

NARROW_PAIRS = 30_000_000
"""The narrowed search lowers its bound until its exact pass has at most this many pairs
to evaluate."""

PAIR_BUDGET = 400_000_000
"""Most (state, state) pairs one search may evaluate before giving up."""

_CHUNK = 1 << 21
"""Pairs evaluated per numpy block."""


def replica_work_s(
    compute_s: Any, param_bytes: Any, replicas: Any, bandwidth_bytes_per_s: float
) -> Any:
    """The work of a stage per batch on ``replicas`` GPUs before it is shared among them:
    its compute plus the all-reduce of its weights between the replicas,
    ``C + 4(r-1)P/(rB)`` (numbers or numpy arrays). The stage takes this over ``r`` per
    batch; every use of the formula (the DP, the feasibility passes, the data-parallel
    baseline) goes through here."""
    r = replicas
    return compute_s + 4 * (r - 1) * param_bytes / (r * bandwidth_bytes_per_s)


@dataclass(frozen=True)
class CostModel:
    """How a stage's time and memory are estimated.

    Attributes:
        gpus: GPUs to use (exactly).
        bandwidth_bytes_per_s: inter-stage and inter-replica bandwidth.
        straight: no replicated stages (exactly ``gpus`` stages).
        activation_term: count activation/gradient transfers between stages.
        memory_limit_bytes: per-GPU memory a stage may use (``None``: no limit).
        optimizer_copies: weight-sized optimizer state copies (momentum: 1).
    """

    gpus: int
    bandwidth_bytes_per_s: float
    straight: bool = False
    activation_term: bool = False
    memory_limit_bytes: float | None = None
    optimizer_copies: int = 1

    def stage_time(
        self,
        compute_s: float,
        param_bytes: float,
        replicas: int,
        act_in_bytes: float = 0.0,
        act_out_bytes: float = 0.0,
    ) -> float:
        """Seconds per batch of a stage (see module docs)."""
        r, b = replicas, self.bandwidth_bytes_per_s
        t = replica_work_s(compute_s, param_bytes, r, b) / r
        if self.activation_term:
            t = max(t, 2 * act_in_bytes / (b * r), 2 * act_out_bytes / (b * r))
        return t

    def in_flight(self, gpus_from_here: int, replicas: int) -> int:
        """Batches a stage holds at once in a 1F1B pipeline: the GPUs from this stage to
        the end over its replicas, rounded up (PipeDream's rule)."""
        return -(-gpus_from_here // replicas)

    def stage_memory(
        self, param_bytes: Any, activation_bytes: Any, replicas: int, gpus_from_here: int
    ) -> Any:
        """Bytes on each GPU of a stage: weights, gradients, optimizer state, and for
        each batch in flight its activations and (all but the newest) a stashed weight
        version (numbers or numpy arrays)."""
        f = self.in_flight(gpus_from_here, replicas)
        return (
            param_bytes * (2 + self.optimizer_copies) + f * activation_bytes + (f - 1) * param_bytes
        )


@dataclass(frozen=True)
class Solution:
    """The DP's answer: stage boundaries as state indices and replicas per stage."""

    bounds: tuple[int, ...]
    """State index at the end of each stage (the last is the final state)."""
    replicas: tuple[int, ...]
    bottleneck_s: float
    pairs: int
    """(state, state) pairs evaluated."""


class _Search:
    """One windowed DP (see module docs)."""

    def __init__(self, g: PartitionGraph, st: States, cm: CostModel) -> None:
        self.g, self.st, self.cm = g, st, cm
        self.C = st.compute_s
        self.P = st.param_bytes
        self.total = float(self.C[st.final])
        self.N = cm.gpus
        self._act = np.full(st.count, np.nan)
        self._actv = np.full(st.count, np.nan)
        self.pairs = 0

    # per-state quantities computed lazily (only for states in windows)
    def act(self, idx: np.ndarray) -> np.ndarray:
        """Boundary activation bytes of states ``idx`` (computed once per state)."""
        return self._cached(self._act, idx, boundary_of)

    def held(self, idx: np.ndarray) -> np.ndarray:
        """Activation bytes of all layers of states ``idx`` (what a prefix keeps for
        its backward)."""
        return self._cached(self._actv, idx, held_of)

    def _cached(self, cache: np.ndarray, idx: np.ndarray, fn: Any) -> np.ndarray:
        todo = idx[np.isnan(cache[idx])]
        if len(todo):
            cache[todo] = fn(self.g, self.st.bits[todo])
        return cache[idx]

    def windows(self, bound: float) -> list[np.ndarray]:
        """State indices that may end the prefix on ``u`` GPUs, ``u = 1..N`` (index 0
        unused)."""
        cum, N, tot = self.C, self.N, self.total
        slack = 1e-9 * max(tot, bound)
        out = [np.empty(0, dtype=np.int64)]
        for u in range(1, N):
            lo, hi = tot - (N - u) * bound - slack, u * bound + slack
            w = np.flatnonzero((cum >= lo) & (cum <= hi))
            out.append(w[w != self.st.final])
        out.append(np.array([self.st.final], dtype=np.int64))
        return out

    def run(self, win: list[np.ndarray]) -> tuple[float, dict[tuple[int, int], tuple[int, int]]]:
        """Best bottleneck with the prefix on ``u`` GPUs ending in ``win[u]``, and the
        choices ``(u, state) -> (previous state or -1, replicas of the last stage)``."""
        cm, N = self.cm, self.N
        best: list[np.ndarray] = [np.empty(0)]
        choice: dict[tuple[int, int], tuple[int, int]] = {}
        for u in range(1, N + 1):
            J = win[u]
            val = np.full(len(J), np.inf)
            arg_k = np.full(len(J), -1, dtype=np.int64)
            arg_r = np.full(len(J), u, dtype=np.int64)
            if len(J) and (u == 1 or not cm.straight):
                val = self.first_stage(J, u)
            for r in range(1, u if not cm.straight else min(u, 2)):
                up = u - r
                K = win[up]
                ok = np.isfinite(best[up])
                if not ok.any() or not len(J):
                    continue
                K, aK = K[ok], best[up][ok]
                v, k = self.extend(K, aK, J, r, up)
                better = v < val
                val = np.where(better, v, val)
                arg_k = np.where(better, k, arg_k)
                arg_r = np.where(better, r, arg_r)
            best.append(val)
            for j, k, r, x in zip(J.tolist(), arg_k.tolist(), arg_r.tolist(), val.tolist()):
                if math.isfinite(x):
                    choice[(u, j)] = (k, r)
        return float(best[N][0]), choice

    def first_stage(self, J: np.ndarray, u: int) -> np.ndarray:
        """``T(empty, j, u)`` for states ``J``: the prefix as one stage on ``u`` GPUs."""
        cm = self.cm
        r, b = u, cm.bandwidth_bytes_per_s
        t = replica_work_s(self.C[J], self.P[J], r, b) / r
        final = self.st.final == J
        if cm.activation_term:
            out = np.where(final, 0.0, self.act(J))
            t = np.maximum(t, 2 * out / (b * r))
        if cm.memory_limit_bytes is not None:
            mem = cm.stage_memory(self.P[J], self.held(J), r, self.N)
            t = np.where(mem <= cm.memory_limit_bytes, t, np.inf)
        return t

    def extend(
        self, K: np.ndarray, aK: np.ndarray, J: np.ndarray, r: int, up: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each state of ``J``: the best ``max(A(k, up), T(k, j, r))`` over ``k`` in
        ``K`` strictly inside it, and that ``k``."""
        cm, st = self.cm, self.st
        b = cm.bandwidth_bytes_per_s
        xK = replica_work_s(self.C[K], self.P[K], r, b)
        xJ = replica_work_s(self.C[J], self.P[J], r, b)
        bitsK = st.bits[K]
        bitsJ = st.bits[J]
        if cm.activation_term:
            aK = np.maximum(aK, 2 * self.act(K) / (b * r))
            outJ = np.where(st.final == J, 0.0, 2 * self.act(J) / (b * r))
        if cm.memory_limit_bytes is not None:
            heldK, heldJ = self.held(K), self.held(J)
        self.pairs += len(K) * len(J)
        if self.pairs > PAIR_BUDGET:
            raise PartitionError(
                f"the search would evaluate more than {PAIR_BUDGET:,} pairs of antichain states"
            )
        out_v = np.full(len(J), np.inf)
        out_k = np.full(len(J), -1, dtype=np.int64)
        step = max(1, _CHUNK // max(1, len(K)))
        words = st.bits.shape[1]
        for a in range(0, len(J), step):
            sl = slice(a, a + step)
            inside = np.ones((len(K), len(J[sl])), dtype=bool)
            for w in range(words):
                inside &= (bitsK[:, w, None] & ~bitsJ[None, sl, w]) == 0
            inside &= K[:, None] != J[None, sl]
            t = (xJ[None, sl] - xK[:, None]) / r
            if cm.activation_term:
                t = np.maximum(t, outJ[None, sl])
            v = np.maximum(aK[:, None], t)
            if cm.memory_limit_bytes is not None:
                mem = cm.stage_memory(
                    self.P[J][None, sl] - self.P[K][:, None],
                    heldJ[None, sl] - heldK[:, None],
                    r,
                    self.N - up,
                )
                inside &= mem <= cm.memory_limit_bytes
            v = np.where(inside, v, np.inf)
            k = np.argmin(v, axis=0)
            out_v[sl] = v[k, np.arange(v.shape[1])]
            out_k[sl] = K[k]
        return out_v, out_k


def lower_bound(g: PartitionGraph, cm: CostModel) -> float:
    """A bottleneck no pipeline can beat: the compute over the GPUs, and for a straight
    pipeline the slowest layer."""
    lb = g.total_compute_s / cm.gpus
    if cm.straight:
        lb = max(lb, max(g.compute_s))
    return lb


def solve(g: PartitionGraph, st: States, cm: CostModel) -> Solution:
    """The optimal pipeline over ``st`` (see module docs); ``PartitionError`` when none
    exists (fewer states than stages, nothing fits in memory)."""
    search = _Search(g, st, cm)
    if st.order is not None and st.count > DENSE_STATES and cm.memory_limit_bytes is None:
        value, choice = _narrowed(search)
    else:
        value, choice = _windowed(search)
    bounds, reps = [], []
    u, j = cm.gpus, st.final
    while True:
        k, r = choice[(u, j)]
        bounds.append(j)
        reps.append(r)
        if k < 0:
            break
        u, j = u - r, k
    return Solution(tuple(reversed(bounds)), tuple(reversed(reps)), value, search.pairs)


def _infeasible(cm: CostModel) -> PartitionError:
    return PartitionError(
        f"no pipeline of exactly {cm.gpus} GPU{'s' if cm.gpus != 1 else ''} "
        "exists"
        + (
            " within the memory limit"
            if cm.memory_limit_bytes is not None
            else " (fewer layers than stages?)"
        )
    )


def _windowed(search: _Search) -> tuple[float, dict[tuple[int, int], tuple[int, int]]]:
    """Search with compute windows around a growing bound (see module docs)."""
    cm, st = search.cm, search.st
    lb = lower_bound(search.g, cm)
    everything = max(search.total, lb) * (1 + 1e-9) + 1e-300
    eps = 1.0 / 64
    bound = lb * (1 + eps) if lb > 0 else everything
    while True:
        windows = search.windows(bound)
        value, choice = search.run(windows)
        if value <= bound * (1 + 1e-12):
            return value, choice
        if math.isfinite(value):
            bound = value  # a pipeline that fast exists: one more exact pass
            continue
        if bound >= everything or all(len(w) >= st.count - 1 for w in windows[1:-1]):
            raise _infeasible(cm)
        eps *= 4
        bound = lb * (1 + eps)


def _narrowed(search: _Search) -> tuple[float, dict[tuple[int, int], tuple[int, int]]]:
    """Search for graphs with many states (see :class:`_Feasibility`).

    The best pipeline over the prefixes of the topological order alone (few states,
    solved exactly by :func:`_windowed`) is feasible, so its bottleneck ``U`` bounds the
    optimum from above. The states that lie on some pipeline no slower than ``U`` are
    found over the state tree; the exact DP then runs over those only. Should they be
    too many, ``U`` is first lowered by bisection.
    """
    cm = search.cm
    chain = _Search(search.g, chain_states(search.g), cm)
    hi, _ = _windowed(chain)
    lo = lower_bound(search.g, cm) * (1 - 1e-12)
    feas = _Feasibility(search)
    while True:
        windows = feas.candidates(hi * (1 + 1e-9))
        if _pairs(windows, cm) <= NARROW_PAIRS or hi <= lo * (1 + 1e-9):
            break
        for _ in range(4):
            mid = 0.5 * (lo + hi)
            if feas.forward(mid)[cm.gpus][feas.final]:
                hi = mid
            else:
                lo = mid
    value, choice = search.run(windows)
    if not math.isfinite(value):
        raise _infeasible(cm)
    return value, choice


def _pairs(windows: list[np.ndarray], cm: CostModel) -> int:
    """Pairs of states the DP over ``windows`` evaluates."""
    n = cm.gpus
    return sum(
        len(windows[u - r]) * len(windows[u])
        for u in range(2, n + 1)
        for r in range(1, 2 if cm.straight else u)
    )


class _Feasibility:
    """Which states can end a prefix of a pipeline no slower than ``T``, computed over
    the state tree (:mod:`simcore.partition.lattice`) for all states at once.

    Positions are the states shifted by one, position 0 the empty set. With
    ``X_r = C + 4(r-1)P/(rB)``, a stage from ``k`` to ``j`` on ``r`` GPUs is no slower
    than ``T`` iff ``X_r(k) >= X_r(j) - rT``: so ``j`` ends a feasible prefix on ``u``
    GPUs iff the largest ``X_r`` over the feasible ``(u-r)``-prefixes strictly inside
    ``j`` is at least ``X_r(j) - rT``, a down-set maximum. Suffixes are the mirror image
    (up-set maxima of ``-X_r``).
    """

    def __init__(self, search: _Search) -> None:
        st, cm = search.st, search.cm
        assert st.order is not None
        self.search, self.order, self.N = search, st.order, cm.gpus
        self.final = st.final + 1
        b = cm.bandwidth_bytes_per_s
        C = np.concatenate(([0.0], st.compute_s))
        self.cum, self.total = C, float(C[self.final])
        P = np.concatenate(([0.0], st.param_bytes))
        self.X = {r: replica_work_s(C, P, r, b) for r in range(1, cm.gpus + 1)}
        self.act = None
        if cm.activation_term:
            self.act = np.concatenate(([0.0], boundary_of(search.g, st.bits)))
            self.act[self.final] = 0.0
        self.rs = {u: [1] if cm.straight else list(range(1, u + 1)) for u in range(1, cm.gpus + 1)}

    def _act_ok(self, r: int, T: float) -> np.ndarray | bool:
        if self.act is None:
            return True
        b = self.search.cm.bandwidth_bytes_per_s
        return 2 * self.act / (b * r) <= T * (1 + 1e-12)

    def window(self, u: int, T: float) -> np.ndarray:
        """Positions whose compute allows them to end the prefix on ``u`` GPUs of a
        pipeline no slower than ``T`` (see the module docs); only these are kept, which
        keeps the inputs of the tree passes sparse."""
        slack = 1e-9 * max(self.total, T)
        lo, hi = self.total - (self.N - u) * T - slack, u * T + slack
        return (self.cum >= lo) & (self.cum <= hi)

    def forward(self, T: float) -> list[np.ndarray]:
        """``F[u]``: positions that end a prefix on exactly ``u`` GPUs with every stage
        no slower than ``T``."""
        return self._pass(T, 0, +1.0, self.order.strictly_below, lambda u: self.window(u, T))

    def backward(self, T: float, F: list[np.ndarray]) -> list[np.ndarray]:
        """``G[v]``: positions that ``F[N - v]`` holds and from which the rest of the
        model fits on exactly ``v`` GPUs with every stage no slower than ``T`` (a state
        of such a pipeline ends a feasible prefix too, so nothing is lost by keeping only
        those, and the tree passes get sparse inputs)."""
        return self._pass(T, self.final, -1.0, self.order.strictly_above, lambda v: F[self.N - v])

    def _pass(
        self,
        T: float,
        start: int,
        sign: float,
        extreme: Callable[[np.ndarray], np.ndarray],
        keep: Callable[[int], np.ndarray],
    ) -> list[np.ndarray]:
        """The feasibility pass of :meth:`forward` (``sign`` +1: prefixes grow from the
        empty set, maxima over the states below) and its mirror image :meth:`backward`
        (``sign`` -1: suffixes grow from the final state, maxima of ``-X`` over the
        states above). ``out[u]``: positions reached on exactly ``u`` GPUs, each stage no
        slower than ``T``, filtered by ``keep(u)``."""
        S = len(self.X[1])
        out = [np.zeros(S, dtype=bool) for _ in range(self.N + 1)]
        out[0][start] = True
        tol = 1 + 1e-12
        for u in range(1, self.N + 1):
            rs = [r for r in self.rs[u] if out[u - r].any()]
            if not rs:
                continue
            rows = np.stack(
                [np.where(out[u - r] & self._act_ok(r, T), sign * self.X[r], -np.inf) for r in rs]
            )
            best = extreme(rows)
            ok = np.zeros(S, dtype=bool)
            for i, r in enumerate(rs):
                ok |= (best[i] >= sign * self.X[r] - r * T * tol) & self._act_ok(r, T)
            ok[start] = False
            out[u] = ok & keep(u)
        return out

    def candidates(self, T: float) -> list[np.ndarray]:
        """State indices that lie on some pipeline no slower than ``T``, per prefix GPU
        count (the windows of the exact DP)."""
        F = self.forward(T)
        G = self.backward(T, F)
        out = [np.empty(0, dtype=np.int64)]
        for u in range(1, self.N):
            out.append(np.flatnonzero(F[u] & G[self.N - u]) - 1)
        out.append(np.array([self.final - 1], dtype=np.int64))
        return out


def _members(g: PartitionGraph, bits: np.ndarray) -> np.ndarray:
    """``(nodes, states)`` membership matrix of bitset rows."""
    member = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=1, bitorder="little")[
        :, : g.n
    ]
    return np.ascontiguousarray(member.T.astype(bool))


def boundary_of(g: PartitionGraph, bits: np.ndarray) -> np.ndarray:
    """Boundary activation bytes of the states with membership ``bits`` (outputs of
    their nodes that a node outside consumes)."""
    member = _members(g, bits)
    out = np.zeros(len(bits))
    for v in range(g.n):
        if not g.succ[v] or not g.activation_bytes[v]:
            continue
        crosses = member[v] & ~np.logical_and.reduce(member[list(g.succ[v])], axis=0)
        out += g.activation_bytes[v] * crosses
    return out


def held_of(g: PartitionGraph, bits: np.ndarray) -> np.ndarray:
    """Activation bytes of all the nodes of the states with membership ``bits``."""
    return np.asarray(g.activation_bytes, dtype=np.float64) @ _members(g, bits)
