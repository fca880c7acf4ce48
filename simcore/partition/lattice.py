"""The order among antichain states, kept as a tree, for fast down-set and up-set maxima.

The states of a graph are built (:mod:`simcore.partition.antichain`) as concatenations
(everything of one piece lies inside everything of the next) and products (independent
branches) of smaller state lists. The same tree answers, for a value on every state,
"the largest value on a state inside this one" for all states at once, with a few numpy
operations per tree node instead of one per pair of states:

* :class:`Unit`: a single state.
* :class:`Ordinal`: parts one after another; a state of part ``i`` contains all states
  of parts before ``i`` and the states of part ``i`` inside it (a chain of layers is an
  ordinal of units).
* :class:`Product`: one state per combination of its factors' states (row-major); one
  state contains another when it does factor by factor.
* :class:`Explicit`: down-sets listed one by one with their covers (what is left over).

Every operation works along one ``axis`` of an array whose other axes are independent
rows: ``down`` gives at each state the maximum over the states it contains (itself
included), ``lower`` the maximum over its lower covers (the states just inside it). The
maximum over the states *strictly* inside is ``down(lower(v))``; over the states
strictly containing, the same on the :meth:`~Lattice.mirror` (reversed order, reversed
list). Empty maxima are ``-inf``; parts of the tree where the
input is ``-inf`` throughout are skipped, which makes sparse inputs cheap.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

NEG = -np.inf


def _live(a: np.ndarray) -> bool:
    """Whether ``a`` holds any value above ``-inf`` (parts without any are skipped)."""
    return bool(a.size) and bool(a.max() > NEG)


def _sl(ndim: int, axis: int, s: slice | int | np.ndarray) -> tuple:
    """An index selecting ``s`` along ``axis``."""
    return (slice(None),) * axis + (s,) + (slice(None),) * (ndim - axis - 1)


class Lattice(ABC):
    """A node of the state tree (see module docs)."""

    size: int

    @abstractmethod
    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Maximum over the states each state contains (itself included)."""

    @abstractmethod
    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Maximum over each state's lower covers."""

    @abstractmethod
    def mirror(self) -> Lattice:
        """The reversed order over the reversed list of states: state ``i`` of the mirror
        is state ``size - 1 - i`` here, and containment is turned around."""

    def strictly_below(self, v: np.ndarray) -> np.ndarray:
        """For ``v`` of shape ``(rows, size)``: the maximum over the states strictly
        inside each state (the lower covers first, so that parts of the tree where
        ``v`` is ``-inf`` throughout are skipped twice)."""
        return self.down(self.lower(v, 1), 1)

    def strictly_above(self, v: np.ndarray) -> np.ndarray:
        """For ``v`` of shape ``(rows, size)``: the maximum over the states strictly
        containing each state (the mirror's maximum below, on reversed arrays, so that
        every pass runs forwards over contiguous memory)."""
        m = getattr(self, "_mirror", None)
        if m is None:
            m = self._mirror = self.mirror()
        return m.strictly_below(np.ascontiguousarray(v[:, ::-1]))[:, ::-1]


class Unit(Lattice):
    """One state."""

    size = 1

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        return a

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        return np.full_like(a, NEG)

    def mirror(self) -> Lattice:
        return self


class Ordinal(Lattice):
    """Parts in sequence; every state of a part lies inside every state of the next."""

    def __init__(self, parts: list[Lattice]) -> None:
        self.parts = parts
        sizes = np.array([p.size for p in parts])
        self.first = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        self.last = self.first + sizes - 1
        self.size = int(sizes.sum())
        self.part_of = np.repeat(np.arange(len(parts)), sizes)
        self.inner = [(int(o), p) for o, p in zip(self.first, parts) if p.size > 1]
        self.chain = not self.inner

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        if self.chain:
            return np.maximum.accumulate(a, axis=axis)
        out = a.copy()
        for o, p in self.inner:
            s = _sl(a.ndim, axis, slice(o, o + p.size))
            if _live(a[s]):
                out[s] = p.down(a[s], axis)
        tops = np.take(out, self.last, axis=axis)  # a part's top holds its maximum
        ex = np.full_like(tops, NEG)
        ex[_sl(a.ndim, axis, slice(1, None))] = np.maximum.accumulate(tops, axis=axis)[
            _sl(a.ndim, axis, slice(None, -1))
        ]
        return np.maximum(out, np.take(ex, self.part_of, axis=axis))

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        out = np.full_like(a, NEG)
        if len(self.parts) > 1:  # a part's bottom lies just above the previous top
            out[_sl(a.ndim, axis, self.first[1:])] = np.take(a, self.last[:-1], axis=axis)
        for o, p in self.inner:
            part = a[_sl(a.ndim, axis, slice(o, o + p.size))]
            if _live(part):
                out[_sl(a.ndim, axis, slice(o + 1, o + p.size))] = p.lower(part, axis)[
                    _sl(a.ndim, axis, slice(1, None))
                ]
        return out

    def mirror(self) -> Lattice:
        return Ordinal([p.mirror() for p in reversed(self.parts)])


class Product(Lattice):
    """All combinations of the factors' states, first factor most significant."""

    def __init__(self, factors: list[Lattice]) -> None:
        self.factors = factors
        self.shape = tuple(f.size for f in factors)
        self.size = int(np.prod(self.shape))

    def _split(self, a: np.ndarray, axis: int) -> np.ndarray:
        a = np.ascontiguousarray(a)
        return a.reshape(a.shape[:axis] + self.shape + a.shape[axis + 1 :])

    def _join(self, a: np.ndarray, axis: int) -> np.ndarray:
        d = len(self.shape)
        return a.reshape((*a.shape[:axis], self.size, *a.shape[axis + d :]))

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        for i, f in enumerate(self.factors):
            x = f.down(x, axis + i)
        return self._join(x, axis)

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        out = None
        for i, f in enumerate(self.factors):
            y = f.lower(x, axis + i)
            out = y if out is None else np.maximum(out, y)
        assert out is not None
        return self._join(out, axis)

    def mirror(self) -> Lattice:
        return Product([f.mirror() for f in self.factors])


class Explicit(Lattice):
    """Down-sets listed one by one, in order of size, with their covers.

    ``lower[i]`` lists the states obtained from state ``i`` by removing one of its
    maximal nodes (all earlier in the list); the order is their transitive closure.
    """

    def __init__(self, lower: list[list[int]]) -> None:
        self.size = len(lower)
        self.covers = lower
        width = max((len(c) for c in lower), default=0)
        self.pad = np.full((self.size, max(width, 1)), -1, dtype=np.int64)
        for i, c in enumerate(lower):
            self.pad[i, : len(c)] = c
        depth = [0] * self.size
        for i, cs in enumerate(lower):
            depth[i] = 1 + max((depth[c] for c in cs), default=-1)
        groups: dict[int, list[int]] = {}
        for i, dpt in enumerate(depth):
            groups.setdefault(dpt, []).append(i)
        self.levels = [np.array(groups[d]) for d in sorted(groups)]

    @staticmethod
    def _rows(a: np.ndarray, axis: int) -> tuple[np.ndarray, tuple[int, ...]]:
        moved = np.moveaxis(a, axis, -1)
        return moved.reshape(-1, moved.shape[-1]), moved.shape

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        r, shape = self._rows(a, axis)
        acc = np.concatenate([r, np.full((r.shape[0], 1), NEG)], axis=1)  # -1: -inf
        for idx in self.levels:
            acc[:, idx] = np.maximum(r[:, idx], acc[:, self.pad[idx]].max(axis=2))
        return np.moveaxis(acc[:, :-1].reshape(shape), -1, axis)

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        r, shape = self._rows(a, axis)
        ext = np.concatenate([r, np.full((r.shape[0], 1), NEG)], axis=1)
        return np.moveaxis(ext[:, self.pad].max(axis=2).reshape(shape), -1, axis)

    def mirror(self) -> Lattice:
        n = self.size
        upper: list[list[int]] = [[] for _ in range(n)]
        for i, cs in enumerate(self.covers):
            for c in cs:
                upper[n - 1 - c].append(n - 1 - i)
        return Explicit(upper)
