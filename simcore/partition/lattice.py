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
included), ``lower`` the maximum over its lower covers (the states just inside it);
``up`` and ``upper`` are the mirror images. The maximum over the states *strictly*
inside is ``down(lower(v))``. Empty maxima are ``-inf``; parts of the tree where the
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
    def up(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Maximum over the states containing each state (itself included)."""

    @abstractmethod
    def upper(self, a: np.ndarray, axis: int) -> np.ndarray:
        """Maximum over each state's upper covers."""

    def strictly_below(self, v: np.ndarray) -> np.ndarray:
        """For ``v`` of shape ``(rows, size)``: the maximum over the states strictly
        inside each state (the lower covers first, so that parts of the tree where
        ``v`` is ``-inf`` throughout are skipped twice)."""
        return self.down(self.lower(v, 1), 1)

    def strictly_above(self, v: np.ndarray) -> np.ndarray:
        """For ``v`` of shape ``(rows, size)``: the maximum over the states strictly
        containing each state."""
        return self.up(self.upper(v, 1), 1)


class Unit(Lattice):
    """One state."""

    size = 1

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        return a

    up = down

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        return np.full_like(a, NEG)

    upper = lower


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
        tops = np.take(out, self.last, axis=axis)          # a part's top holds its maximum
        ex = np.full_like(tops, NEG)
        ex[_sl(a.ndim, axis, slice(1, None))] = np.maximum.accumulate(
            tops, axis=axis)[_sl(a.ndim, axis, slice(None, -1))]
        return np.maximum(out, np.take(ex, self.part_of, axis=axis))

    def up(self, a: np.ndarray, axis: int) -> np.ndarray:
        if self.chain:
            return np.flip(np.maximum.accumulate(np.flip(a, axis), axis=axis), axis)
        out = a.copy()
        for o, p in self.inner:
            s = _sl(a.ndim, axis, slice(o, o + p.size))
            if _live(a[s]):
                out[s] = p.up(a[s], axis)
        bottoms = np.take(out, self.first, axis=axis)      # a part's bottom: its maximum
        suf = np.flip(np.maximum.accumulate(np.flip(bottoms, axis), axis=axis), axis)
        ex = np.full_like(bottoms, NEG)
        ex[_sl(a.ndim, axis, slice(None, -1))] = suf[_sl(a.ndim, axis, slice(1, None))]
        return np.maximum(out, np.take(ex, self.part_of, axis=axis))

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        out = np.full_like(a, NEG)
        if len(self.parts) > 1:     # a part's bottom lies just above the previous top
            out[_sl(a.ndim, axis, self.first[1:])] = np.take(a, self.last[:-1], axis=axis)
        for o, p in self.inner:
            part = a[_sl(a.ndim, axis, slice(o, o + p.size))]
            if _live(part):
                out[_sl(a.ndim, axis, slice(o + 1, o + p.size))] = p.lower(
                    part, axis)[_sl(a.ndim, axis, slice(1, None))]
        return out

    def upper(self, a: np.ndarray, axis: int) -> np.ndarray:
        out = np.full_like(a, NEG)
        if len(self.parts) > 1:
            out[_sl(a.ndim, axis, self.last[:-1])] = np.take(a, self.first[1:], axis=axis)
        for o, p in self.inner:
            part = a[_sl(a.ndim, axis, slice(o, o + p.size))]
            if _live(part):
                out[_sl(a.ndim, axis, slice(o, o + p.size - 1))] = p.upper(
                    part, axis)[_sl(a.ndim, axis, slice(None, -1))]
        return out


class Product(Lattice):
    """All combinations of the factors' states, first factor most significant."""

    def __init__(self, factors: list[Lattice]) -> None:
        self.factors = factors
        self.shape = tuple(f.size for f in factors)
        self.size = int(np.prod(self.shape))

    def _split(self, a: np.ndarray, axis: int) -> np.ndarray:
        a = np.ascontiguousarray(a)
        return a.reshape(a.shape[:axis] + self.shape + a.shape[axis + 1:])

    def _join(self, a: np.ndarray, axis: int) -> np.ndarray:
        d = len(self.shape)
        return a.reshape((*a.shape[:axis], self.size, *a.shape[axis + d:]))

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        for i, f in enumerate(self.factors):
            x = f.down(x, axis + i)
        return self._join(x, axis)

    def up(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        for i, f in enumerate(self.factors):
            x = f.up(x, axis + i)
        return self._join(x, axis)

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        out = None
        for i, f in enumerate(self.factors):
            y = f.lower(x, axis + i)
            out = y if out is None else np.maximum(out, y)
        assert out is not None
        return self._join(out, axis)

    def upper(self, a: np.ndarray, axis: int) -> np.ndarray:
        x = self._split(a, axis)
        out = None
        for i, f in enumerate(self.factors):
            y = f.upper(x, axis + i)
            out = y if out is None else np.maximum(out, y)
        assert out is not None
        return self._join(out, axis)


class Explicit(Lattice):
    """Down-sets listed one by one, in order of size, with their covers.

    ``lower[i]`` lists the states obtained from state ``i`` by removing one of its
    maximal nodes (all earlier in the list); the order is their transitive closure.
    """

    def __init__(self, lower: list[list[int]]) -> None:
        self.size = len(lower)
        upper: list[list[int]] = [[] for _ in lower]
        for i, cs in enumerate(lower):
            for c in cs:
                upper[c].append(i)
        self.lower_pad = self._pad(lower)
        self.upper_pad = self._pad(upper)
        self.down_levels = self._levels(lower, range(self.size))
        self.up_levels = self._levels(upper, range(self.size - 1, -1, -1))

    @staticmethod
    def _pad(covers: list[list[int]]) -> np.ndarray:
        """Cover indices padded with ``-1`` (a column of ``-inf``)."""
        width = max((len(c) for c in covers), default=0)
        pad = np.full((len(covers), max(width, 1)), -1, dtype=np.int64)
        for i, c in enumerate(covers):
            pad[i, :len(c)] = c
        return pad

    def _levels(self, covers: list[list[int]], order: range) -> list[np.ndarray]:
        """Groups of states whose covers all lie in earlier groups."""
        depth = [0] * self.size
        for i in order:
            depth[i] = 1 + max((depth[c] for c in covers[i]), default=-1)
        groups: dict[int, list[int]] = {}
        for i, dpt in enumerate(depth):
            groups.setdefault(dpt, []).append(i)
        return [np.array(groups[d]) for d in sorted(groups)]

    @staticmethod
    def _rows(a: np.ndarray, axis: int) -> tuple[np.ndarray, tuple[int, ...]]:
        moved = np.moveaxis(a, axis, -1)
        return moved.reshape(-1, moved.shape[-1]), moved.shape

    @staticmethod
    def _back(r: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
        return np.moveaxis(r.reshape(shape), -1, axis)

    def _closure(self, a: np.ndarray, axis: int, pad: np.ndarray,
                 levels: list[np.ndarray]) -> np.ndarray:
        r, shape = self._rows(a, axis)
        acc = np.concatenate([r, np.full((r.shape[0], 1), NEG)], axis=1)
        for idx in levels:
            acc[:, idx] = np.maximum(r[:, idx], acc[:, pad[idx]].max(axis=2))
        return self._back(acc[:, :-1], shape, axis)

    def _covers(self, a: np.ndarray, axis: int, pad: np.ndarray) -> np.ndarray:
        r, shape = self._rows(a, axis)
        ext = np.concatenate([r, np.full((r.shape[0], 1), NEG)], axis=1)
        return self._back(ext[:, pad].max(axis=2), shape, axis)

    def down(self, a: np.ndarray, axis: int) -> np.ndarray:
        return self._closure(a, axis, self.lower_pad, self.down_levels)

    def up(self, a: np.ndarray, axis: int) -> np.ndarray:
        return self._closure(a, axis, self.upper_pad, self.up_levels)

    def lower(self, a: np.ndarray, axis: int) -> np.ndarray:
        return self._covers(a, axis, self.lower_pad)

    def upper(self, a: np.ndarray, axis: int) -> np.ndarray:
        return self._covers(a, axis, self.upper_pad)
