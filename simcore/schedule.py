"""Pipeline schedules as plain data: per-rank action lists, a compact text form, a
validator and a rank-by-step grid.

A :class:`Schedule` says, for every rank, what it does in which order: forward and
backward passes of micro-batch ``m`` of its stage, sending and receiving activations and
gradients, weight updates, loading a stashed weight version, SpecTrain's weight
prediction, re-materialisation, and the gradient all-reduce among the replicas of a
stage. It holds no timing and nothing of SimPy: the simulator's runner
(:mod:`simcore.schemes._pipeline`) and the real runtime execute the very same lists.

Compact text form of an action: ``{stage}{kind}{micro-batch}``, with the peer rank for
point-to-point transfers: ``0F3`` (stage 0, forward of micro-batch 3), ``1B0``,
``2SA3>3`` (stage 2 sends the activation of micro-batch 3 to rank 3), ``3RA3<2``,
``1SG0>0``, ``0RG0<1``, ``0U7`` (weight update after micro-batch 7), ``1L2`` (load the
weight version micro-batch 2's forward used), ``2P5`` (predict weights before a pass of
micro-batch 5), ``0R4`` (recompute the forward of micro-batch 4), ``0AR6`` (all-reduce
the gradients of the round of micro-batches starting at 6 among the stage's replicas),
and the zero-bubble split of a backward: ``1I3`` (the gradient with respect to the
stage's input only) and ``1W3`` (its weight gradient, later).

**Virtual stages.** A rank may run several stages (model chunks): ``stages`` then lists a
rank more than once, looped (rank ``s mod N`` runs stage ``s``) or V-shaped (ranks
``0..N-1`` then back ``N-1..0``; see :func:`placement`). Activations between two stages on
the same rank need no send. Every stage and micro-batch has one forward and either one
full backward ``B`` or one ``I`` followed later by one ``W``.

**torch's vocabulary.** :func:`to_torch` / :func:`from_torch` write and read the action
strings of ``torch.distributed.pipelining`` (``2F0``, ``1I3``, ``0W1``, ``1B0``,
``0SEND_F1``, ``1RECV_F1``, ``1SEND_B0``, ``0RECV_B0``; DualPipeV's
``(0F3;1B2)OVERLAP_F_B`` reads as its two passes in order) and :func:`to_torch_csv` /
:func:`from_torch_csv` its CSV (one row per rank), so a schedule goes from torch to us and
back.

:meth:`Schedule.validate` checks each forward comes before its backward on the same rank,
every micro-batch passes every stage exactly once, every send has its receive, every
replica joins every all-reduce, and, by a dry run in unit steps (compute takes a step,
communication none), that nothing deadlocks. Errors name the rank and step and show the
grid so far; :meth:`Schedule.grid` draws the dry run:

    step   0  1  2  3  4  5  6  7 ...
    rank0  F0 F1 F2 F3 .  .  B0 F4 ...
    rank1  .  F0 F1 F2 .  B0 F3 B1 ...
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

FORWARD, BACKWARD, RECOMPUTE, UPDATE = "F", "B", "R", "U"
INPUT_GRAD, WEIGHT_GRAD = "I", "W"
LOAD, PREDICT, ALLREDUCE = "L", "P", "AR"
SEND_ACT, RECV_ACT, SEND_GRAD, RECV_GRAD = "SA", "RA", "SG", "RG"

COMPUTE_KINDS = (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD, RECOMPUTE, UPDATE, PREDICT)
"""Actions that occupy the rank's compute stream."""
PASS_KINDS = (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD, RECOMPUTE)
"""Passes over the stage's layers: one step each in the dry run (updates and weight
prediction are short vector operations and take none there)."""
SEND_KINDS = (SEND_ACT, SEND_GRAD)
RECV_KINDS = (RECV_ACT, RECV_GRAD)
KINDS = (*COMPUTE_KINDS, LOAD, ALLREDUCE, *SEND_KINDS, *RECV_KINDS)

_MATCH = {SEND_ACT: RECV_ACT, SEND_GRAD: RECV_GRAD}
_TOKEN = re.compile(r"^(\d+)(AR|SA|RA|SG|RG|F|B|I|W|R|U|L|P)(\d+)(?:([<>])(\d+))?$")


class ScheduleError(ValueError):
    """A schedule is malformed or deadlocks; the message names the rank and step and
    carries the grid of the dry run up to there."""


@dataclass(frozen=True)
class Action:
    """One step of a rank's list.

    Attributes:
        kind: one of :data:`KINDS`.
        stage: the stage the rank runs.
        mb: micro-batch index (for ``AR`` the first micro-batch of the round).
        peer: the other rank of a send or receive (``-1`` otherwise).
    """

    kind: str
    stage: int
    mb: int
    peer: int = -1

    def __str__(self) -> str:
        text = f"{self.stage}{self.kind}{self.mb}"
        if self.kind in SEND_KINDS:
            return f"{text}>{self.peer}"
        if self.kind in RECV_KINDS:
            return f"{text}<{self.peer}"
        return text

    @classmethod
    def parse(cls, token: str) -> Action:
        """An action from its compact text (``ScheduleError`` if malformed)."""
        m = _TOKEN.match(token.strip())
        if not m:
            raise ScheduleError(
                f"cannot read action {token!r}; expected e.g. 0F3, 1B0, "
                "2SA3>3, 3RA3<2, 0U7, 1L2, 2P5, 0R4, 0AR6"
            )
        stage, kind, mb, arrow, peer = m.groups()
        p2p = kind in SEND_KINDS or kind in RECV_KINDS
        want = ">" if kind in SEND_KINDS else "<"
        if p2p != (arrow is not None) or (p2p and arrow != want):
            rule = (
                "sends take >RANK, receives <RANK" if p2p else "only sends and receives name a peer"
            )
            raise ScheduleError(f"action {token!r}: {rule}")
        return cls(kind, int(stage), int(mb), int(peer) if peer is not None else -1)

    @property
    def label(self) -> str:
        """Short label for the grid (``F3``, ``B0``, ``U7``)."""
        return f"{self.kind}{self.mb}"


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists of a pipeline (see module docs).

    Attributes:
        name: the scheme that made it.
        stages: ranks of each stage (several for a replicated stage).
        microbatches: micro-batches the lists cover in all.
        per_iteration: micro-batches per iteration (micro-batch ``m`` belongs to
            iteration ``m // per_iteration``).
        actions: the action list of each rank.
    """

    name: str
    stages: tuple[tuple[int, ...], ...]
    microbatches: int
    per_iteration: int
    actions: tuple[tuple[Action, ...], ...]

    @property
    def ranks(self) -> int:
        """Number of ranks."""
        return len(self.actions)

    def stage_of(self) -> list[int]:
        """Stage of each rank (its first, for a rank that runs several)."""
        return [st[0] if st else -1 for st in self.local_stages()]

    def local_stages(self) -> list[tuple[int, ...]]:
        """The stages each rank runs, in stage order (one, or several virtual stages)."""
        out: list[list[int]] = [[] for _ in range(self.ranks)]
        for s, ranks in enumerate(self.stages):
            for r in ranks:
                if 0 <= r < self.ranks:
                    out[r].append(s)
        return [tuple(x) for x in out]

    @property
    def virtual(self) -> bool:
        """Whether some rank runs more than one stage."""
        return len(self.stages) > self.ranks

    def iteration_of(self, action: Action) -> int:
        """Iteration an action belongs to."""
        return action.mb // self.per_iteration

    # ---- text form -------------------------------------------------------------------
    def to_text(self) -> str:
        """One line per rank: ``rank R (stage S): 0F0 0SA0>1 ...`` (``stages S,T`` for a
        rank with virtual stages)."""
        local = self.local_stages()
        return "\n".join(
            f"rank {r} ({'stages' if len(local[r]) > 1 else 'stage'} "
            f"{','.join(map(str, local[r]))}): " + " ".join(map(str, acts))
            for r, acts in enumerate(self.actions)
        )

    @classmethod
    def from_text(
        cls, text: str, name: str = "custom", per_iteration: int | None = None
    ) -> Schedule:
        """Read :meth:`to_text` output (``ScheduleError`` if malformed)."""
        actions: list[tuple[Action, ...]] = []
        stages: dict[int, list[int]] = {}
        for lineno, line in enumerate(text.strip().splitlines(), start=1):
            m = re.match(r"^rank (\d+) \(stages? (\d+(?:,\d+)*)\):(.*)$", line.strip())
            if not m or int(m.group(1)) != len(actions):
                raise ScheduleError(
                    f"line {lineno}: expected 'rank {len(actions)} (stage S): ACTIONS' "
                    "or 'rank R (stages S,T,...): ACTIONS'"
                )
            for st in m.group(2).split(","):
                stages.setdefault(int(st), []).append(len(actions))
            actions.append(tuple(Action.parse(t) for t in m.group(3).split()))
        if sorted(stages) != list(range(len(stages))):
            raise ScheduleError(f"stages must be numbered 0..{len(stages) - 1}")
        mbs = {a.mb for acts in actions for a in acts if a.kind == FORWARD}
        total = max(mbs) + 1 if mbs else 0
        return cls(
            name,
            tuple(tuple(stages[s]) for s in range(len(stages))),
            total,
            per_iteration or max(total, 1),
            tuple(actions),
        )

    # ---- checks ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ScheduleError` unless the schedule is sound (see module docs)."""
        self._static_checks()
        _dry_run(self, strict=True)

    def grid(self, max_steps: int | None = None) -> str:
        """The rank-by-step grid of the unit-step dry run (passes; ``.`` idle)."""
        cells, _ = _dry_run(self, strict=False)
        return _draw(cells, max_steps)

    def _static_checks(self) -> None:
        local = self.local_stages()
        if any(not st for st in local):
            raise ScheduleError(f"rank {[bool(st) for st in local].index(False)} runs no stage")
        sends: Counter[tuple[str, int, int, int, int]] = Counter()
        recvs: Counter[tuple[str, int, int, int, int]] = Counter()
        passes: Counter[tuple[str, int, int]] = Counter()
        for r, acts in enumerate(self.actions):
            state: dict[tuple[int, int], str] = {}  # (stage, micro-batch) -> last pass seen
            for i, a in enumerate(acts):
                where = f"rank {r}, step {i} ({a})"
                if a.stage not in local[r]:
                    runs = ", ".join(map(str, local[r]))
                    raise ScheduleError(f"{where}: rank {r} runs stage {runs}, not {a.stage}")
                if a.kind in _AFTER:
                    key = (a.stage, a.mb)
                    if state.get(key) not in _AFTER[a.kind]:
                        raise ScheduleError(f"{where}: {_misplaced(a, state.get(key))}")
                    state[key] = a.kind
                    passes[(a.kind, a.stage, a.mb)] += 1
                elif a.kind in SEND_KINDS + RECV_KINDS:
                    if not 0 <= a.peer < self.ranks:
                        raise ScheduleError(f"{where}: peer rank {a.peer} does not exist")
                    if a.kind in SEND_KINDS:
                        sends[(a.kind, r, a.peer, a.mb, a.stage)] += 1
                    else:
                        recvs[(a.kind, a.peer, r, a.mb, a.stage)] += 1
            open_ = [(st, m, k) for (st, m), k in state.items() if k in (FORWARD, INPUT_GRAD)]
            if open_:
                st, m, k = open_[0]
                what = "backward" if k == FORWARD else "weight-gradient pass (W)"
                raise ScheduleError(
                    f"rank {r}: stage {st}'s micro-batch {m} has no {what} after its {k}"
                )
        for s in range(len(self.stages)):
            for m in range(self.microbatches):
                n = passes[(FORWARD, s, m)]
                if n != 1:
                    raise ScheduleError(
                        f"stage {s}: micro-batch {m} has {n} forward passes (expected 1)"
                    )
                full, split = passes[(BACKWARD, s, m)], passes[(WEIGHT_GRAD, s, m)]
                if full + split != 1:
                    raise ScheduleError(
                        f"stage {s}: micro-batch {m} has {full} full backward (B) and "
                        f"{split} split (I then W) passes (expected one of them)"
                    )
        for (kind, src, dst, mb, st), n in sends.items():
            to = st + (1 if kind == SEND_ACT else -1)
            if recvs[(_MATCH[kind], src, dst, mb, to)] != n:
                raise ScheduleError(
                    f"rank {src}: {st}{kind}{mb}>{dst} has no matching "
                    f"receive {to}{_MATCH[kind]}{mb}<{src} on rank {dst}"
                )
        unmatched = recvs - Counter(
            {
                (_MATCH[k], a, b, m, st + (1 if k == SEND_ACT else -1)): n
                for (k, a, b, m, st), n in sends.items()
            }
        )
        for kind, src, dst, mb, st in unmatched:
            raise ScheduleError(
                f"rank {dst}: {st}{kind}{mb}<{src} has no matching send on rank {src}"
            )
        for s, ranks in enumerate(self.stages):
            rounds = [
                [a.mb for a in self.actions[r] if a.kind == ALLREDUCE and a.stage == s]
                for r in ranks
            ]
            if any(x != rounds[0] for x in rounds):
                raise ScheduleError(
                    f"stage {s}: its replicas {list(ranks)} do not join the "
                    "same all-reduces in the same order"
                )


_AFTER: dict[str, tuple[str | None, ...]] = {
    FORWARD: (None,),
    BACKWARD: (FORWARD,),
    INPUT_GRAD: (FORWARD,),
    WEIGHT_GRAD: (INPUT_GRAD,),
}
"""The pass that must come last before each pass of a (stage, micro-batch) on its rank."""


def _misplaced(a: Action, last: str | None) -> str:
    """Why pass ``a`` may not follow ``last`` for its stage and micro-batch."""
    if a.kind == FORWARD:
        return f"second forward of micro-batch {a.mb}"
    if a.kind == WEIGHT_GRAD:
        return (
            f"weight-gradient pass (W) of micro-batch {a.mb} without its "
            "input-gradient pass (I) before it on this rank"
        )
    if last is None:
        return f"backward of micro-batch {a.mb} without a forward before it on this rank"
    return f"second backward of micro-batch {a.mb}"


def _dry_run(s: Schedule, strict: bool) -> tuple[list[list[str]], int]:
    """Run the lists in unit steps: a pass takes one step, everything else none (a
    message can be received in the step after the sender's preceding pass).
    Returns the grid cells per rank and the number of steps; with ``strict`` a deadlock
    raises :class:`ScheduleError`."""
    n = s.ranks
    virtual = s.virtual
    pos = [0] * n
    cells: list[list[str]] = [[] for _ in range(n)]
    posted: Counter[tuple[str, int, int, int, int]] = Counter()
    arrived: dict[tuple[int, int], set[int]] = {}
    done_ar: set[tuple[int, int]] = set()
    step = 0
    while any(pos[r] < len(s.actions[r]) for r in range(n)):
        moved = True
        progress = False
        while moved:  # communication, until nothing changes
            moved = False
            for r in range(n):
                acts = s.actions[r]
                while pos[r] < len(acts):
                    a = acts[pos[r]]
                    if a.kind in SEND_KINDS:
                        to = a.stage + (1 if a.kind == SEND_ACT else -1)
                        posted[(_MATCH[a.kind], r, a.peer, a.mb, to)] += 1
                    elif a.kind in RECV_KINDS:
                        key = (a.kind, a.peer, r, a.mb, a.stage)
                        if posted[key] <= 0:
                            break
                        posted[key] -= 1
                    elif a.kind == ALLREDUCE:
                        key2 = (a.stage, a.mb)
                        if key2 not in done_ar:
                            arrived.setdefault(key2, set()).add(r)
                            if len(arrived[key2]) < len(s.stages[a.stage]):
                                break
                            done_ar.add(key2)
                    elif a.kind not in (LOAD, UPDATE, PREDICT):
                        break
                    pos[r] += 1
                    moved = progress = True
        for r in range(n):  # one compute action per rank
            acts = s.actions[r]
            if pos[r] < len(acts) and acts[pos[r]].kind in PASS_KINDS:
                a = acts[pos[r]]
                cells[r].append(str(a) if virtual else a.label)
                pos[r] += 1
                progress = True
            else:
                cells[r].append(".")
        if not progress:
            for r in range(n):
                cells[r].pop()
            _trim(cells)
            step = len(cells[0]) if cells else 0
            stuck = [r for r in range(n) if pos[r] < len(s.actions[r])]
            if strict:
                why = "; ".join(_waiting(s, r, pos[r], arrived) for r in stuck)
                raise ScheduleError(
                    f"deadlock at step {step}: {why}\n" + _draw(cells, None, mark=step, stuck=stuck)
                )
            break
        step += 1
    _trim(cells)
    return cells, len(cells[0]) if cells else 0


def _trim(cells: list[list[str]]) -> None:
    """Drop trailing steps in which no rank ran a pass."""
    while cells and cells[0] and all(row and row[-1] == "." for row in cells):
        for row in cells:
            row.pop()


def _waiting(s: Schedule, r: int, i: int, arrived: dict[tuple[int, int], set[int]]) -> str:
    a = s.actions[r][i]
    if a.kind in RECV_KINDS:
        what = "activation" if a.kind == RECV_ACT else "gradient"
        return (
            f"rank {r} (its action {i}, {a}) waits for the {what} of micro-batch {a.mb} "
            f"from rank {a.peer}"
        )
    got = sorted(arrived.get((a.stage, a.mb), set()))
    return (
        f"rank {r} (its action {i}, {a}) waits for the all-reduce of stage {a.stage} "
        f"(joined: {got})"
    )


def _draw(
    cells: Sequence[Sequence[str]], max_steps: int | None, mark: int = -1, stuck: Sequence[int] = ()
) -> str:
    steps = max((len(c) for c in cells), default=0)
    if mark >= 0:
        steps = max(steps, mark + 1)
    if max_steps is not None:
        steps = min(steps, max_steps)
    width = max([len(x) for row in cells for x in row[:steps]] + [len(str(steps - 1)), 1])
    head = f"{'step':<7}" + " ".join(f"{i:<{width}}" for i in range(steps))
    lines = [head.rstrip()]
    for r, row in enumerate(cells):
        shown = [*row[:steps]] + ["."] * (steps - min(len(row), steps))
        if mark >= 0 and r in stuck and mark < steps:
            shown[mark] = "!"
        lines.append((f"{'rank' + str(r):<7}" + " ".join(f"{x:<{width}}" for x in shown)).rstrip())
    if max_steps is not None and max((len(c) for c in cells), default=0) > max_steps:
        lines.append(f"(first {max_steps} of {max(len(c) for c in cells)} steps)")
    return "\n".join(lines)


# ---- schedules of the pipeline schemes ---------------------------------------------------


def replica_of(stages: Sequence[Sequence[int]], stage: int, mb: int) -> int:
    """The rank of ``stage`` that processes micro-batch ``mb`` (round-robin)."""
    ranks = stages[stage]
    return ranks[mb % len(ranks)]


def version_difference(stage: int, stages: int, forward: bool) -> int:
    """SpecTrain's prediction distance for a pass at ``stage`` of ``stages`` (its reference
    code): ``floor(k/2) + N - k - 1`` before a forward, ``floor(k/2)`` before a backward.
    A pass with distance 0 needs no prediction."""
    return stage // 2 + (stages - stage - 1 if forward else 0)


def _forward(
    stages: Sequence[Sequence[int]], s: int, m: int, predict: bool, recompute: bool = False
) -> list[Action]:
    out = []
    if s > 0:
        out.append(Action(RECV_ACT, s, m, replica_of(stages, s - 1, m)))
    if predict and version_difference(s, len(stages), True) > 0:
        out.append(Action(PREDICT, s, m))
    out.append(Action(FORWARD, s, m))
    if s < len(stages) - 1:
        out.append(Action(SEND_ACT, s, m, replica_of(stages, s + 1, m)))
    return out


def _backward(
    stages: Sequence[Sequence[int]], s: int, m: int, *, stash: bool, predict: bool, recompute: bool
) -> list[Action]:
    out = []
    if s < len(stages) - 1:
        out.append(Action(RECV_GRAD, s, m, replica_of(stages, s + 1, m)))
    if recompute:
        out.append(Action(RECOMPUTE, s, m))
    if stash:
        out.append(Action(LOAD, s, m))
    if predict and version_difference(s, len(stages), False) > 0:
        out.append(Action(PREDICT, s, m))
    out.append(Action(BACKWARD, s, m))
    if s > 0:
        out.append(Action(SEND_GRAD, s, m, replica_of(stages, s - 1, m)))
    return out


def _check_shape(stages: Sequence[Sequence[int]], per_iteration: int, iterations: int) -> None:
    ranks = sorted(r for st in stages for r in st)
    if not stages or any(not st for st in stages) or ranks != list(range(len(ranks))):
        raise ScheduleError("stages must list ranks 0..N-1, each in exactly one stage")
    if per_iteration < 1 or iterations < 1:
        raise ScheduleError("need at least one micro-batch and one iteration")


def gpipe(
    stages: Sequence[Sequence[int]],
    microbatches: int,
    iterations: int = 1,
    recompute: bool = False,
    name: str = "gpipe",
) -> Schedule:
    """GPipe: per iteration, every micro-batch forward through all stages, then every
    backward (in micro-batch order), then one weight update (replicas all-reduce first).
    With ``recompute`` each backward is preceded by re-running the stage's forward."""
    _check_shape(stages, microbatches, iterations)
    per_rank: dict[int, list[Action]] = {r: [] for st in stages for r in st}
    for it in range(iterations):
        mbs = range(it * microbatches, (it + 1) * microbatches)
        last = mbs[-1]
        for s, ranks in enumerate(stages):
            for m in mbs:  # fill
                per_rank[replica_of(stages, s, m)].extend(_forward(stages, s, m, False))
            for m in mbs:  # drain
                per_rank[replica_of(stages, s, m)].extend(
                    _backward(stages, s, m, stash=False, predict=False, recompute=recompute)
                )
            for r in ranks:  # flush
                if len(ranks) > 1:
                    per_rank[r].append(Action(ALLREDUCE, s, mbs[0]))
                per_rank[r].append(Action(UPDATE, s, last))
    return Schedule(
        name,
        tuple(tuple(st) for st in stages),
        microbatches * iterations,
        microbatches,
        tuple(tuple(per_rank[r]) for r in range(len(per_rank))),
    )


def one_f_one_b(
    stages: Sequence[Sequence[int]],
    microbatches: int,
    iterations: int = 1,
    stash: bool = True,
    predict: bool = False,
    name: str = "pipedream",
) -> Schedule:
    """Asynchronous 1F1B (PipeDream, SpecTrain): no flush; each backward is followed by
    the stage's weight update (replicas all-reduce each round of micro-batches first).

    Micro-batch ``m`` runs on replica ``m mod r`` of a stage with ``r`` replicas. A rank
    runs the backward of ``m`` once it has run its forwards of all its micro-batches up to
    ``m + W``, where ``W`` is the number of GPUs from its stage to the end minus one:
    ``N - k - 1`` warm-up forwards at stage ``k`` of a straight pipeline, then one forward
    and one backward in turn, then the remaining backwards (drain). ``stash`` loads the
    weight version of the micro-batch's forward before its backward; ``predict`` adds
    SpecTrain's weight prediction before every pass that predicts ahead
    (:func:`version_difference` > 0).
    """
    _check_shape(stages, microbatches, iterations)
    total = microbatches * iterations
    for s, ranks in enumerate(stages):
        if total % len(ranks):
            raise ScheduleError(
                f"stage {s} has {len(ranks)} replicas: the micro-batches "
                f"({total}) must be a multiple of that"
            )
    per_rank: dict[int, list[Action]] = {}
    for s, ranks in enumerate(stages):
        ahead = sum(len(st) for st in stages[s:]) - 1
        r_s = len(ranks)
        for rep, r in enumerate(ranks):
            own = list(range(rep, total, r_s))
            acts: list[Action] = []
            f = b = 0
            while b < len(own):
                if f < len(own) and own[f] <= own[b] + ahead:  # warm-up / steady F
                    acts.extend(_forward(stages, s, own[f], predict))
                    f += 1
                    continue
                m = own[b]  # steady B / drain
                acts.extend(_backward(stages, s, m, stash=stash, predict=predict, recompute=False))
                if r_s > 1:
                    acts.append(Action(ALLREDUCE, s, m - rep))
                acts.append(Action(UPDATE, s, m))
                b += 1
            per_rank[r] = acts
    return Schedule(
        name,
        tuple(tuple(st) for st in stages),
        total,
        microbatches,
        tuple(tuple(per_rank[r]) for r in range(len(per_rank))),
    )


def straight_stages(n: int) -> tuple[tuple[int, ...], ...]:
    """``n`` stages of one rank each: ``((0,), (1,), ...)``."""
    return tuple((r,) for r in range(n))


def stages_from_replicas(replicas: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Consecutive ranks per stage: ``[2, 1]`` -> ``((0, 1), (2,))``."""
    out, r = [], 0
    for k in replicas:
        out.append(tuple(range(r, r + k)))
        r += k
    return tuple(out)


# ---- virtual stages and torch's vocabulary ----------------------------------------------

PLACEMENTS = ("loop", "v")
"""How virtual stages sit on ranks: ``loop`` (stage ``s`` on rank ``s mod N``) or ``v``
(stages ``0..N-1`` on ranks ``0..N-1``, stages ``N..2N-1`` back on ``N-1..0``, and so on)."""


def placement(ranks: int, chunks: int, style: str = "loop") -> tuple[tuple[int, ...], ...]:
    """The rank of each of ``ranks * chunks`` stages (as :attr:`Schedule.stages`)."""
    if style not in PLACEMENTS:
        raise ScheduleError(f"placement {style!r} is not one of {', '.join(PLACEMENTS)}")
    out = []
    for s in range(ranks * chunks):
        lap, pos = divmod(s, ranks)
        out.append((pos if style == "loop" or lap % 2 == 0 else ranks - 1 - pos,))
    return tuple(out)


def with_comms(
    name: str,
    stages: Sequence[Sequence[int]],
    compute: Sequence[Sequence[Action]],
    microbatches: int,
    iterations: int = 1,
    updates: bool = True,
) -> Schedule:
    """A whole schedule from per-rank lists of passes (``F``, ``B``, ``I``, ``W``) of one
    iteration over virtual stages: each pass gets the receive it needs right before it
    and its send right after it (none between two stages on the same rank), and, with
    ``updates``, each rank ends an iteration with one weight update per stage it runs.
    ``iterations`` repeats the lists with micro-batches ``iM .. (i+1)M - 1``."""
    rank_of = [st[0] for st in stages]
    last = len(stages) - 1
    out: list[list[Action]] = [[] for _ in compute]
    for it in range(iterations):
        base = it * microbatches
        for r, passes_ in enumerate(compute):
            acts = out[r]
            for p in passes_:
                s, m = p.stage, p.mb + base
                if p.kind == FORWARD:
                    if s > 0 and rank_of[s - 1] != r:
                        acts.append(Action(RECV_ACT, s, m, rank_of[s - 1]))
                    acts.append(Action(FORWARD, s, m))
                    if s < last and rank_of[s + 1] != r:
                        acts.append(Action(SEND_ACT, s, m, rank_of[s + 1]))
                elif p.kind in (BACKWARD, INPUT_GRAD):
                    if s < last and rank_of[s + 1] != r:
                        acts.append(Action(RECV_GRAD, s, m, rank_of[s + 1]))
                    acts.append(Action(p.kind, s, m))
                    if s > 0 and rank_of[s - 1] != r:
                        acts.append(Action(SEND_GRAD, s, m, rank_of[s - 1]))
                elif p.kind == WEIGHT_GRAD:
                    acts.append(Action(WEIGHT_GRAD, s, m))
                else:
                    raise ScheduleError(f"rank {r}: {p} is not a pass (F, B, I or W)")
            if updates:
                mine = sorted({p.stage for p in passes_})
                acts.extend(Action(UPDATE, s, base + microbatches - 1) for s in mine)
    return Schedule(
        name,
        tuple(tuple(st) for st in stages),
        microbatches * iterations,
        microbatches,
        tuple(tuple(a) for a in out),
    )


_TORCH_KIND = {SEND_ACT: "SEND_F", RECV_ACT: "RECV_F", SEND_GRAD: "SEND_B", RECV_GRAD: "RECV_B"}
_FROM_TORCH = {v: k for k, v in _TORCH_KIND.items()}
_TORCH_TOKEN = re.compile(
    r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|F|I|W|B)(\d*)$"
)
TORCH_SKIPPED = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
"""torch actions :func:`from_torch` leaves out: FSDP's parameter sharding and gradient
reduction bookkeeping, which these pipelines do not have."""


def to_torch(a: Action) -> str:
    """``a`` in torch's action form (``2F0``, ``1I3``, ``0SEND_F1``, ``1RECV_B0``)."""
    if a.kind in (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD):
        return f"{a.stage}{a.kind}{a.mb}"
    if a.kind in _TORCH_KIND:
        return f"{a.stage}{_TORCH_KIND[a.kind]}{a.mb}"
    raise ScheduleError(f"{a} has no torch action (torch's schedules have F, I, W, B, SEND/RECV)")


def to_torch_rows(s: Schedule, compute_only: bool = False) -> list[list[str]]:
    """Each rank's actions in torch's form (``compute_only``: its passes alone, torch's
    ``pipeline_order``); weight updates are left out (torch steps the optimizer outside
    its schedule)."""
    keep = (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD) if compute_only else None
    return [
        [to_torch(a) for a in acts if a.kind != UPDATE and (keep is None or a.kind in keep)]
        for acts in s.actions
    ]


def to_torch_csv(s: Schedule, compute_only: bool = False) -> str:
    """:func:`to_torch_rows` as torch's schedule CSV (one row per rank)."""
    return "\n".join(",".join(row) for row in to_torch_rows(s, compute_only)) + "\n"


def _torch_passes(token: str) -> list[tuple[int, str, int]]:
    """The ``(stage, kind, micro-batch)`` of one torch action string (two for an
    ``OVERLAP_F_B``; none for an empty cell or a skipped kind)."""
    token = token.strip()
    if not token:
        return []
    m = re.match(r"^\((.*)\)OVERLAP_F_B$", token)
    if m:
        return [p for sub in m.group(1).split(";") for p in _torch_passes(sub)]
    m = _TORCH_TOKEN.match(token)
    if not m or (m.group(2) not in TORCH_SKIPPED and not m.group(3)):
        raise ScheduleError(
            f"cannot read torch action {token!r}; expected e.g. 2F0, 1I3, 0W1, 1B0, "
            "0SEND_F1, 1RECV_B0 or (0F3;1B2)OVERLAP_F_B"
        )
    if m.group(2) in TORCH_SKIPPED:
        return []
    return [(int(m.group(1)), m.group(2), int(m.group(3)))]


def from_torch(rows: Sequence[Sequence[str]], name: str = "torch", iterations: int = 1) -> Schedule:
    """A schedule from torch's per-rank action strings (its ``pipeline_order`` or
    ``pipeline_order_with_comms`` as strings, or :func:`from_torch_csv`'s rows).

    The rank of each stage is where its passes are. The passes keep their order; the sends
    and receives are :func:`with_comms`'s (no weight updates): torch posts its receives
    ahead and waits for them at the pass that needs them, ours wait right before that pass,
    which is the same order of work. ``iterations`` repeats the lists."""
    parsed = [[p for tok in row for p in _torch_passes(tok)] for row in rows]
    parsed = [[p for p in row if p[1] not in _FROM_TORCH] for row in parsed]
    rank_of: dict[int, int] = {}
    for r, row in enumerate(parsed):
        for st, _kind, _m in row:
            if rank_of.setdefault(st, r) != r:
                raise ScheduleError(f"stage {st} has passes on ranks {rank_of[st]} and {r}")
    if sorted(rank_of) != list(range(len(rank_of))):
        raise ScheduleError(f"the passes name stages {sorted(rank_of)}, not 0..{len(rank_of) - 1}")
    stages = tuple((rank_of[s],) for s in range(len(rank_of)))
    mbs = 1 + max((m for row in parsed for _s, _k, m in row), default=-1)
    compute = [[Action(k, s, m) for s, k, m in row] for row in parsed]
    return with_comms(name, stages, compute, mbs, iterations, updates=False)


def from_torch_csv(text: str, name: str = "torch") -> Schedule:
    """A schedule from torch's schedule CSV (see :func:`from_torch`); cells are action
    strings, an ``OVERLAP_F_B`` cell's sub-actions separated by ``;``."""
    rows = [[c for c in line.split(",")] for line in text.strip().splitlines()]
    return from_torch(rows, name)


def compute_passes(s: Schedule, rank: int, iteration: int | None = None) -> list[str]:
    """Rank ``rank``'s passes (``F``, ``B``, ``I``, ``W``) in torch's form, optionally of
    one iteration only (micro-batches numbered from 0 within it)."""
    out = []
    for a in s.actions[rank]:
        if a.kind not in (FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD):
            continue
        if iteration is not None and s.iteration_of(a) != iteration:
            continue
        mb = a.mb - (iteration or 0) * s.per_iteration
        out.append(f"{a.stage}{a.kind}{mb}")
    return out
