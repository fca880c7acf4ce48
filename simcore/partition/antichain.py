"""The states of the antichain DAG: every legal stage boundary of a layer DAG.

PipeDream's optimizer (and docs/schemes.md, section 9) builds the *antichain DAG*: starting
from the first source, a state is an antichain of the layer graph, and a move replaces a
node of the (augmented) antichain by one of its out-neighbours. What a state stands for
is the set of layers *up to and including* the antichain, a down-set (ideal) of the
graph: a stage boundary. A move from down-set ``I`` adds a node ``y`` outside ``I``
that has a direct predecessor in ``I``, together with all of ``y``'s ancestors. So:

* in a graph with one source, the states are exactly the non-empty down-sets;
* with several sources (inputs removed from a translation model, for example), a further
  source only enters together with a descendant that is reachable by a move.

We enumerate the same set of states without walking the antichain DAG node by node:

* A node comparable with every other node (a *cut node*: the add at the end of a
  residual block, the concat at the end of an Inception module) splits the graph: every
  down-set either contains it, and with it everything before it, or contains nothing
  after it. The down-sets are the concatenation, over the pieces between cut nodes, of
  "everything before the piece" plus a down-set of the piece.
* The parts of a piece that do not touch each other (the branches of an Inception
  module) are independent: the down-sets of the piece are all combinations of down-sets
  of its parts, computed with numpy broadcasting.
* Whatever has no such structure is enumerated breadth-first.

Each state carries its cumulative compute seconds and parameter bytes (sums over its
layers) and its membership bitset (``uint64`` words), from which inclusion between states
and the layers of a stage are read. Raw Inception-v3 has 221,564 states; they take well
under a second to enumerate this way (PipeDream's optimizer runs out of memory on it).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from simcore.partition.graph import PartitionError, PartitionGraph
from simcore.partition.lattice import Explicit, Lattice, Ordinal, Product, Unit

DEFAULT_MAX_STATES = 2_000_000
"""Largest number of states searched exactly; bigger graphs fall back to the prefixes of
one topological order (see :func:`chain_states`)."""

GENERIC_MAX_STATES = 100_000
"""Largest number of down-sets enumerated one by one for a piece without structure (the
pieces with structure are combined with numpy and are cheap)."""


@dataclass(frozen=True)
class States:
    """Stage boundaries (down-sets) of a :class:`PartitionGraph`.

    Attributes:
        compute_s: cumulative compute seconds of each state.
        param_bytes: cumulative parameter bytes of each state (float).
        bits: ``(states, words)`` uint64 membership bitsets (node ``v`` is bit
            ``v % 64`` of word ``v // 64``).
        final: index of the state holding every node.
        exact: ``True`` when these are all the antichain DAG's states, ``False`` for the
            prefixes of one topological order (the fallback for huge graphs).
        order: the containment order as a :class:`Lattice` over the states with the
            empty set prepended (position 0), when known.
    """

    compute_s: np.ndarray
    param_bytes: np.ndarray
    bits: np.ndarray
    final: int
    exact: bool = True
    order: Lattice | None = None

    @property
    def count(self) -> int:
        """Number of states."""
        return len(self.compute_s)

    def nodes(self, index: int) -> frozenset[int]:
        """The nodes of state ``index``."""
        out = set()
        for w, word in enumerate(self.bits[index].tolist()):
            while word:
                low = word & -word
                out.add(64 * w + low.bit_length() - 1)
                word ^= low
        return frozenset(out)


class _Builder:
    """Recursive enumeration of the down-sets of induced sub-DAGs (see module docs)."""

    def __init__(self, g: PartitionGraph, max_states: int) -> None:
        self.g = g
        self.max_states = max_states
        self.words = (g.n + 63) // 64
        n = g.n
        anc = [0] * n
        for v in range(n):
            a = 0
            for p in g.pred[v]:
                a |= anc[p] | (1 << p)
            anc[v] = a
        desc = [0] * n
        for v in range(n - 1, -1, -1):
            d = 0
            for s in g.succ[v]:
                d |= desc[s] | (1 << s)
            desc[v] = d
        self.anc, self.desc = anc, desc
        self.pred_mask = [sum(1 << p for p in g.pred[v]) for v in range(n)]
        self.compute = np.asarray(g.compute_s, dtype=np.float64)
        self.params = np.asarray(g.param_bytes, dtype=np.float64)

    # ---- helpers -----------------------------------------------------------------------
    def to_words(self, mask: int) -> np.ndarray:
        """A Python-int bitset as a row of uint64 words."""
        out = np.zeros(self.words, dtype=np.uint64)
        w = 0
        while mask:
            out[w] = mask & 0xFFFFFFFFFFFFFFFF
            mask >>= 64
            w += 1
        return out

    def sums(self, mask: int) -> tuple[float, float]:
        """Compute seconds and parameter bytes of the nodes of ``mask``."""
        c = p = 0.0
        while mask:
            low = mask & -mask
            v = low.bit_length() - 1
            c += self.compute[v]
            p += self.params[v]
            mask ^= low
        return c, p

    def components(self, nodes: list[int]) -> list[list[int]]:
        """Weakly connected components of the sub-DAG induced by ``nodes`` (sorted)."""
        inside = set(nodes)
        parent = {v: v for v in nodes}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for v in nodes:
            for s in self.g.succ[v]:
                if s in inside:
                    a, b = find(v), find(s)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        groups: dict[int, list[int]] = {}
        for v in nodes:
            groups.setdefault(find(v), []).append(v)
        return list(groups.values())

    def cuts(self, nodes: list[int]) -> list[int]:
        """Positions (in ``nodes``) of the nodes comparable with all others."""
        mask = 0
        for v in nodes:
            mask |= 1 << v
        return [
            i
            for i, v in enumerate(nodes)
            if ((self.anc[v] | self.desc[v] | (1 << v)) & mask) == mask
        ]

    # ---- counting (to refuse hopeless graphs before allocating anything) ------------------
    def count(self, nodes: list[int], budget: int) -> int:
        """Number of down-sets (with the empty one) of the sub-DAG on ``nodes``; anything
        above ``budget`` is reported as ``budget + 1``."""
        if not nodes:
            return 1
        comps = self.components(nodes)
        if len(comps) > 1:
            total = 1
            for c in comps:
                total *= self.count(c, budget)
                if total > budget:
                    return budget + 1
            return total
        cuts = self.cuts(nodes)
        if not cuts:
            # Nodes at the same depth are pairwise incomparable, so any subset of one
            # level is an antichain: 2**(largest level) down-sets at least.
            cap = min(budget, GENERIC_MAX_STATES)
            if self.widest_level(nodes) >= cap.bit_length():
                return budget + 1
            found = len(self.generic(nodes, cap))
            return budget + 1 if found > cap else found
        total = 0
        for seg in self.pieces(nodes, cuts):
            total += self.count(seg, budget)
            if total > budget:
                return budget + 1
        return total

    def widest_level(self, nodes: list[int]) -> int:
        """Size of the largest set of ``nodes`` at equal longest-path depth."""
        inside = set(nodes)
        depth: dict[int, int] = {}
        for v in nodes:
            depth[v] = 1 + max((depth[p] for p in self.g.pred[v] if p in inside), default=-1)
        counts: dict[int, int] = {}
        for d in depth.values():
            counts[d] = counts.get(d, 0) + 1
        return max(counts.values())

    @staticmethod
    def pieces(nodes: list[int], cuts: list[int]) -> list[list[int]]:
        """The part before the first cut node, then the part after each cut node."""
        bounds = [*cuts, len(nodes)]
        out = [nodes[: cuts[0]]]
        for a, b in itertools.pairwise(bounds):
            out.append(nodes[a + 1 : b])
        return out

    # ---- enumeration ------------------------------------------------------------------
    def generic(self, nodes: list[int], budget: int) -> list[int]:
        """All down-sets of the sub-DAG on ``nodes``, breadth-first, as Python-int
        bitsets (at most ``budget + 1`` of them)."""
        inside = 0
        for v in nodes:
            inside |= 1 << v
        need = {v: self.pred_mask[v] & inside for v in nodes}
        succ = {v: [s for s in self.g.succ[v] if (inside >> s) & 1] for v in nodes}
        first = 0
        for v in nodes:
            if not need[v]:
                first |= 1 << v
        order, ready = [0], [first]  # ready: minimal nodes not yet included
        seen = {0}
        i = 0
        while i < len(order):
            cur, free = order[i], ready[i]
            i += 1
            f = free
            while f:
                low = f & -f
                f ^= low
                nxt = cur | low
                if nxt in seen:
                    continue
                seen.add(nxt)
                nfree = free ^ low
                for t in succ[low.bit_length() - 1]:
                    if need[t] & ~nxt == 0:
                        nfree |= 1 << t
                order.append(nxt)
                ready.append(nfree)
                if len(order) > budget:
                    return order
        return order

    def ideals(self, nodes: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, Lattice]:
        """``(compute, params, bits, order)`` of every down-set of the sub-DAG on
        ``nodes``, the empty set first; ``order`` is its :class:`Lattice`."""
        W = self.words
        if not nodes:
            return np.zeros(1), np.zeros(1), np.zeros((1, W), dtype=np.uint64), Unit()
        comps = self.components(nodes)
        if len(comps) > 1:
            c, p, b, t = self.ideals(comps[0])
            factors = [t]
            for comp in comps[1:]:
                c2, p2, b2, t2 = self.ideals(comp)
                c = (c[:, None] + c2[None, :]).ravel()
                p = (p[:, None] + p2[None, :]).ravel()
                b = (b[:, None, :] | b2[None, :, :]).reshape(-1, W)
                factors.append(t2)
            return c, p, b, Product(factors)
        cuts = self.cuts(nodes)
        if not cuts:
            masks = self.generic(nodes, self.max_states)
            sums = [self.sums(m) for m in masks]
            bits = np.stack([self.to_words(m) for m in masks])
            return (
                np.array([s[0] for s in sums]),
                np.array([s[1] for s in sums]),
                bits,
                self.explicit(nodes, masks),
            )
        parts_c, parts_p, parts_b, parts_t = [], [], [], []
        base = 0
        for k, seg in enumerate(self.pieces(nodes, cuts)):
            if k > 0:
                base |= 1 << nodes[cuts[k - 1]]
            c, p, b, t = self.ideals(seg)
            bc, bp = self.sums(base)
            parts_c.append(c + bc)
            parts_p.append(p + bp)
            parts_b.append(b | self.to_words(base)[None, :])
            parts_t.append(t)
            for v in seg:
                base |= 1 << v
        return (
            np.concatenate(parts_c),
            np.concatenate(parts_p),
            np.concatenate(parts_b),
            Ordinal(parts_t),
        )

    def explicit(self, nodes: list[int], masks: list[int]) -> Explicit:
        """The order among down-sets ``masks`` of the sub-DAG on ``nodes``: the lower
        covers of a down-set drop one of its maximal nodes."""
        inside = 0
        for v in nodes:
            inside |= 1 << v
        succ_in = {v: sum(1 << s for s in self.g.succ[v]) & inside for v in nodes}
        index = {m: i for i, m in enumerate(masks)}
        lower = []
        for m in masks:
            cs = []
            x = m
            while x:
                low = x & -x
                x ^= low
                if not succ_in[low.bit_length() - 1] & m:
                    cs.append(index[m ^ low])
            lower.append(cs)
        return Explicit(lower)

    def reachable(self) -> list[int]:
        """States of a graph with several sources: breadth-first from the first source,
        a move adds a node with a direct predecessor in the state plus its ancestors."""
        g = self.g
        succ_mask = [sum(1 << s for s in g.succ[v]) for v in range(g.n)]
        order = [1]  # {first source}
        reach = [succ_mask[0]]  # nodes with a direct predecessor in the state
        seen = {1}
        i = 0
        while i < len(order):
            cur, out = order[i], reach[i]
            i += 1
            f = out & ~cur
            while f:
                low = f & -f
                f ^= low
                new = (self.anc[low.bit_length() - 1] | low) & ~cur
                nxt = cur | new
                if nxt in seen:
                    continue
                seen.add(nxt)
                grow = out
                while new:
                    lo = new & -new
                    grow |= succ_mask[lo.bit_length() - 1]
                    new ^= lo
                order.append(nxt)
                reach.append(grow)
                if len(order) > self.max_states:
                    return order
        return order


def antichain_states(g: PartitionGraph, max_states: int = DEFAULT_MAX_STATES) -> States:
    """Every state of ``g``'s antichain DAG (see module docs); ``PartitionError`` if
    there are more than ``max_states``."""
    b = _Builder(g, max_states)
    everything = list(range(g.n))
    too_many = PartitionError(
        f"too many antichain states to search exactly (more than {max_states:,}, or more "
        f"than {GENERIC_MAX_STATES:,} in a part without cut nodes or independent branches)"
    )
    if len(g.sources()) == 1:
        if b.count(everything, max_states + 1) - 1 > max_states:  # minus the empty set
            raise too_many
        c, p, bits, order = b.ideals(everything)
        c, p, bits = c[1:], p[1:], bits[1:]
    else:
        order = None
        masks = b.reachable()
        if len(masks) > max_states:
            raise too_many
        sums = [b.sums(m) for m in masks]
        c = np.array([s[0] for s in sums])
        p = np.array([s[1] for s in sums])
        bits = np.stack([b.to_words(m) for m in masks])
    full = b.to_words((1 << g.n) - 1)
    final = int(np.flatnonzero((bits == full[None, :]).all(axis=1))[0])
    return States(c, p, bits, final, exact=True, order=order)


def chain_states(g: PartitionGraph) -> States:
    """The prefixes of the graph's topological order as states (every one a legal
    boundary, but not all of them): the search space of a straight layer chain."""
    b = _Builder(g, g.n)
    bits = np.stack([b.to_words((1 << (i + 1)) - 1) for i in range(g.n)])
    c = np.cumsum(np.asarray(g.compute_s, dtype=np.float64))
    p = np.cumsum(np.asarray(g.param_bytes, dtype=np.float64))
    return States(c, p, bits, g.n - 1, exact=False)
