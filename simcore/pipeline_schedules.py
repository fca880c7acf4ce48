"""Today's pipeline schedules as data: interleaved 1F1B, looped BFS, interleaved zero
bubble, ZBV, DualPipeV (as ``torch.distributed.pipelining`` 2.13 orders them), the
zero-bubble paper's ZB-H1 and its baseline, synchronous 1F1B.

Each generator returns, for ``N`` ranks and ``M`` micro-batches, the passes every rank runs
in one iteration (``F``, ``B``, and the zero-bubble split of a backward into ``I``, the
input gradient, and ``W``, the weight gradient), over ``v`` virtual stages per rank;
:func:`simcore.schedule.with_comms` adds the sends, receives and weight updates. The
orders are ours, written from the papers and from reading torch's generators, and equal
torch's pass for pass (``tests/test_pipeline_schedules.py`` compares them). In words:

* **interleaved** (Megatron's virtual stages, arXiv 2104.04473): stage ``s`` on rank
  ``s mod N``. Micro-batches go in rounds of ``P = M / max(1, M // N)``: a rank runs
  the forwards of ``P`` micro-batches on one chunk, then the same ``P`` on its next
  chunk, and so on (depth first). Rank ``r`` first runs ``(v-1)P + 2(N-1-r)`` forwards
  (capped at ``vM``), then one forward and one backward in turn, then the remaining
  backwards; backwards visit the chunks in reverse order, ``P`` at a time.
* **looped-bfs** (arXiv 2211.05953): every forward of chunk 0, then of chunk 1, ...;
  then the backwards of the last chunk first, each chunk's micro-batches last to first.
* **zb-interleaved** (the zero-bubble paper's ZB1P on interleaved stages, arXiv
  2401.10241): interleaved's order with warm-up ``(v-1)P + (N-1-r)``, every backward
  an ``I``, and after the ``j``-th ``I`` the ``W`` of the ``(j-r)``-th backward (rank ``r``
  holds ``r`` weight passes back, run at the very end).
* **1f1b** (synchronous 1F1B, PipeDream-Flush; the baseline of the zero-bubble paper):
  one stage per rank; rank ``r`` runs ``min(N-1-r, M)`` forwards, then one forward and
  one full backward in turn, then the remaining backwards; a flush per iteration.
* **zb-h1** (the paper's Figure 3, top): 1F1B (warm-up ``N-1-r`` forwards) with ``I``
  for ``B``, each rank delaying its ``W`` passes by ``r`` micro-batches so that every rank
  keeps ``N`` micro-batches in flight, as 1F1B's first rank does; the held-back ``W``
  passes fill the tail. Bubble ``(N-1)(T_F + T_I - T_W)``, a third of 1F1B's when the
  three passes take equally long.
* **zbv** (the paper's section 6): two chunks per rank in a V (rank ``r`` runs stages
  ``r`` and ``2N-1-r``). Warm-up: ``2(N-r)-1`` forwards of chunk 0; ``r`` pairs (chunk
  1 forward, chunk 0 forward); ``N-r`` triples (chunk 1 F, I, W). Steady: chunk 0 F (while
  any are left), I, W; chunk 1 F, I, W. Cool-down: ``r`` pairs of ``I`` (chunk 0, chunk
  1); ``N-r`` pairs (chunk 0 I, its oldest W); the remaining W of chunk 1, then of chunk 0.
  It is laid out for ``max(M, 2N-1)`` micro-batches and the passes of micro-batches
  beyond ``M`` are dropped.
* **dualpipev** (DeepSeek's DualPipe cut to a V, arXiv 2412.19437; needs ``M >= 2N``):
  rank ``r`` runs stages ``r`` and ``2N-1-r``. Steps: ``2(N-r-1)`` chunk-0 forwards;
  ``r+1`` pairs (chunk 0 F, chunk 1 F); ``N-r-1`` triples (chunk 1 I, the oldest pending
  W, chunk 1 F); ``M-2N+r+1`` rounds of two overlapped pairs (chunk 0 F with chunk 1 B,
  chunk 1 F with chunk 0 B; the last rank's first pair not overlapped); ``N-r-1`` pairs
  (chunk 1 B, then chunk 1 F overlapped with chunk 0 B); ``r+1`` pairs of backwards of
  chunk 1 and chunk 0, the second half of them split (``I``, its ``W`` queued); ``N-r-1``
  (pending W, chunk 0 backward); the remaining W. An overlapped pair runs as its forward
  then its backward here (torch's runtime runs them in turn too).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

from simcore.schedule import (
    BACKWARD,
    FORWARD,
    INPUT_GRAD,
    WEIGHT_GRAD,
    Action,
    Schedule,
    ScheduleError,
    placement,
    with_comms,
)

Passes = list[list[Action]]
"""The passes of one iteration, per rank."""


class _Counter:
    """The next micro-batch of each (stage, pass kind) on one rank."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, str], int] = defaultdict(int)
        self.out: list[Action] = []

    def add(self, stage: int, kind: str, count_as: str | None = None) -> Action:
        """Append ``kind`` of ``stage``'s next micro-batch (counted under ``count_as``)."""
        key = (stage, count_as or kind)
        a = Action(kind, stage, self.next[key])
        self.next[key] += 1
        self.out.append(a)
        return a


def rounds(ranks: int, microbatches: int) -> int:
    """Micro-batches per round of the interleaved schedules: ``M / max(1, M // N)``;
    ``ScheduleError`` unless that divides ``M``."""
    n_rounds = max(1, microbatches // ranks)
    if microbatches % n_rounds:
        ok = [m for m in range(ranks, 4 * ranks + 1) if m % max(1, m // ranks) == 0]
        raise ScheduleError(
            f"{microbatches} micro-batches do not split into {n_rounds} equal rounds "
            f"(M / max(1, M // N) with N = {ranks} ranks); "
            f"{', '.join(map(str, ok[:8]))}, ... or at most {ranks} work"
        )
    return microbatches // n_rounds


def _depth_first(
    rank: int, ranks: int, chunks: int, microbatches: int, zero_bubble: bool
) -> list[Action]:
    """Interleaved 1F1B (``zero_bubble``: ZB1P) passes of one rank (see module docs)."""
    per_round = rounds(ranks, microbatches)
    hop = 1 if zero_bubble else 2
    warmup = min((chunks - 1) * per_round + hop * (ranks - 1 - rank), chunks * microbatches)
    total = chunks * microbatches
    c = _Counter()

    def fwd_chunk(k: int) -> int:
        return (k // per_round) % chunks * ranks + rank

    def bwd_chunk(k: int) -> int:
        return (chunks - 1 - (k // per_round) % chunks) * ranks + rank

    held: deque[int] = deque()  # stages of backwards whose W is still to run

    def backward(j: int) -> None:
        stage = bwd_chunk(j)
        if not zero_bubble:
            c.add(stage, BACKWARD)
            return
        c.add(stage, INPUT_GRAD)
        held.append(stage)
        if j >= rank:
            c.add(held.popleft(), WEIGHT_GRAD)

    for k in range(warmup):
        c.add(fwd_chunk(k), FORWARD)
    for j in range(total):
        if warmup + j < total:
            c.add(fwd_chunk(warmup + j), FORWARD)
        backward(j)
    while held:
        c.add(held.popleft(), WEIGHT_GRAD)
    return c.out


def interleaved(ranks: int, chunks: int, microbatches: int) -> Passes:
    """Interleaved 1F1B (torch's ``ScheduleInterleaved1F1B``)."""
    return [_depth_first(r, ranks, chunks, microbatches, False) for r in range(ranks)]


def zb_interleaved(ranks: int, chunks: int, microbatches: int) -> Passes:
    """Interleaved zero bubble, ZB1P (torch's ``ScheduleInterleavedZeroBubble``)."""
    return [_depth_first(r, ranks, chunks, microbatches, True) for r in range(ranks)]


def looped_bfs(ranks: int, chunks: int, microbatches: int) -> Passes:
    """Looped BFS (torch's ``ScheduleLoopedBFS``)."""
    out = []
    for r in range(ranks):
        mine = [r + k * ranks for k in range(chunks)]
        acts = [Action(FORWARD, s, m) for s in mine for m in range(microbatches)]
        acts += [
            Action(BACKWARD, s, m) for s in reversed(mine) for m in reversed(range(microbatches))
        ]
        out.append(acts)
    return out


def _one_f_one_b(ranks: int, microbatches: int, split: bool) -> Passes:
    """Synchronous 1F1B (``split``: with the backward split and rank ``r``'s weight
    passes ``r`` micro-batches late, ZB-H1); see module docs."""
    out = []
    for r in range(ranks):
        warmup = min(ranks - 1 - r, microbatches)
        acts = [Action(FORWARD, r, m) for m in range(warmup)]
        for j in range(microbatches):
            if warmup + j < microbatches:
                acts.append(Action(FORWARD, r, warmup + j))
            acts.append(Action(INPUT_GRAD if split else BACKWARD, r, j))
            if split and j >= r:
                acts.append(Action(WEIGHT_GRAD, r, j - r))
        if split:
            acts += [
                Action(WEIGHT_GRAD, r, m) for m in range(max(0, microbatches - r), microbatches)
            ]
        out.append(acts)
    return out


def one_f_one_b_flush(ranks: int, microbatches: int) -> Passes:
    """Synchronous 1F1B with a flush (see module docs): one stage per rank."""
    return _one_f_one_b(ranks, microbatches, False)


def zb_h1(ranks: int, microbatches: int) -> Passes:
    """The zero-bubble paper's ZB-H1 (see module docs): one stage per rank."""
    return _one_f_one_b(ranks, microbatches, True)


def zbv(ranks: int, microbatches: int) -> Passes:
    """ZBV (torch's ``ScheduleZBVZeroBubble``; see module docs)."""
    n = max(2 * ranks - 1, microbatches)
    out = []
    for r in range(ranks):
        c = _Counter()
        s0, s1 = r, 2 * ranks - 1 - r

        def count(stage: int, kind: str, c: _Counter = c) -> int:
            return c.next[(stage, kind)]

        for _ in range(2 * (ranks - r) - 1):
            c.add(s0, FORWARD)
        for _ in range(r):
            c.add(s1, FORWARD)
            c.add(s0, FORWARD)
        for _ in range(ranks - r):
            c.add(s1, FORWARD)
            c.add(s1, INPUT_GRAD)
            c.add(s1, WEIGHT_GRAD)
        while count(s1, FORWARD) < count(s0, FORWARD) or count(s0, FORWARD) < n:
            if count(s0, FORWARD) < n:
                c.add(s0, FORWARD)
            c.add(s0, INPUT_GRAD)
            c.add(s0, WEIGHT_GRAD)
            c.add(s1, FORWARD)
            c.add(s1, INPUT_GRAD)
            c.add(s1, WEIGHT_GRAD)
        for _ in range(r):
            c.add(s0, INPUT_GRAD)
            c.add(s1, INPUT_GRAD)
        for _ in range(ranks - r):
            c.add(s0, INPUT_GRAD)
            c.add(s0, WEIGHT_GRAD)
        for s in (s1, s0):
            while count(s, WEIGHT_GRAD) < count(s, INPUT_GRAD):
                c.add(s, WEIGHT_GRAD)
        out.append([a for a in c.out if a.mb < microbatches])
    return out


def dualpipev(ranks: int, microbatches: int) -> Passes:
    """DualPipeV (torch's ``ScheduleDualPipeV``; see module docs)."""
    if microbatches < 2 * ranks:
        raise ScheduleError(
            f"DualPipeV needs at least as many micro-batches as stages: "
            f"{microbatches} < 2 x {ranks} ranks; use {2 * ranks} or more"
        )
    out = []
    for r in range(ranks):
        c = _Counter()
        s0, s1 = r, 2 * ranks - 1 - r
        pending: deque[Action] = deque()

        def bwd(stage: int, split: bool, c: _Counter = c, pending: deque[Action] = pending) -> None:
            if split:
                a = c.add(stage, INPUT_GRAD, count_as=INPUT_GRAD)
                pending.append(Action(WEIGHT_GRAD, stage, a.mb))
            else:
                c.add(stage, BACKWARD, count_as=INPUT_GRAD)

        def weight(c: _Counter = c, pending: deque[Action] = pending) -> None:
            if pending:
                c.out.append(pending.popleft())

        for _ in range(2 * (ranks - r - 1)):
            c.add(s0, FORWARD)
        for _ in range(r + 1):
            c.add(s0, FORWARD)
            c.add(s1, FORWARD)
        for _ in range(ranks - r - 1):
            bwd(s1, True)
            weight()
            c.add(s1, FORWARD)
        for _ in range(microbatches - 2 * ranks + r + 1):
            c.add(s0, FORWARD)
            bwd(s1, False)
            c.add(s1, FORWARD)
            bwd(s0, False)
        for _ in range(ranks - r - 1):
            bwd(s1, False)
            c.add(s1, FORWARD)
            bwd(s0, False)
        split = False
        for i in range(r + 1):
            split = split or (i == (r + 1) // 2 and r % 2 == 1)
            bwd(s1, split)
            split = split or (i == (r + 1) // 2 and r % 2 == 0)
            bwd(s0, split)
        for _ in range(ranks - r - 1):
            weight()
            bwd(s0, split)
        while pending:
            weight()
        out.append(c.out)
    return out


SCHEDULES: dict[str, tuple[str, Callable[..., Passes]]] = {
    "1f1b": ("loop", one_f_one_b_flush),
    "interleaved": ("loop", interleaved),
    "looped-bfs": ("loop", looped_bfs),
    "zb-interleaved": ("loop", zb_interleaved),
    "zb-h1": ("loop", zb_h1),
    "zbv": ("v", zbv),
    "dualpipev": ("v", dualpipev),
}
"""Each schedule's placement and generator (``1f1b``, ``zb-h1``, ``zbv`` and
``dualpipev`` take no chunk count: one stage per rank, two in a V)."""

FIXED_CHUNKS = {"1f1b": 1, "zb-h1": 1, "zbv": 2, "dualpipev": 2}
"""Chunks per rank of the schedules that fix them."""


def make(name: str, ranks: int, chunks: int, microbatches: int, iterations: int = 1) -> Schedule:
    """The whole schedule ``name`` (a key of :data:`SCHEDULES`) for ``ranks`` ranks with
    ``chunks`` stages each, ``microbatches`` per iteration, with sends, receives and
    weight updates (``ScheduleError`` naming what works when it cannot be made)."""
    if name not in SCHEDULES:
        raise ScheduleError(f"no schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    style, gen = SCHEDULES[name]
    fixed = FIXED_CHUNKS.get(name)
    if fixed is not None and chunks != fixed:
        raise ScheduleError(f"{name} runs {fixed} stage(s) per rank, not {chunks}")
    if ranks < 1 or chunks < 1 or microbatches < 1 or iterations < 1:
        raise ScheduleError("need at least one rank, chunk, micro-batch and iteration")
    passes = gen(ranks, microbatches) if fixed is not None else gen(ranks, chunks, microbatches)
    return with_comms(name, placement(ranks, chunks, style), passes, microbatches, iterations)
