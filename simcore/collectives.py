"""Collective operations over a group of ranks, in both network fidelities.

Algorithms (``p`` ranks, ``n`` bytes, ``alpha`` per-message latency, ``B`` bandwidth):

* ``ring`` all-reduce: reduce-scatter then all-gather around a ring, ``2(p-1)`` steps of
  ``n/p`` bytes: ``2(p-1)·alpha + 2(p-1)/p · n/B``.
* ring reduce-scatter and all-gather: ``(p-1)·alpha + (p-1)/p · n/B``.
* ``tree`` all-reduce: binomial-tree reduce to the first rank, then binomial broadcast,
  ``ceil(log2 p)`` steps of ``n`` bytes each: ``2·ceil(log2 p)·(alpha + n/B)``.
* ``hierarchical`` all-reduce: tree reduce inside each box to its first rank, ring
  all-reduce among those leaders across boxes, tree broadcast inside each box.
* ``broadcast``: binomial tree from the first rank, or ``flat`` (the root sends ``p-1``
  full copies, as gloo does on CPU).

**Detailed** fidelity turns an algorithm into its point-to-point messages on the
network; a rank sends the message of step ``s`` as soon as it has received everything
addressed to it in earlier steps, so ranks progress independently and contend for links.
**Analytic** fidelity computes each collective in one event. Ring phases take the closed
form above, with ``alpha`` the largest route latency among the step's sends and ``B`` the
smallest bandwidth share a send gets (a link direction used by ``k`` sends of one step
gives each ``1/k`` of it). Trees and broadcasts are walked send by send (see
:meth:`Collectives.duration`): a rank sends as soon as it has what it needs, and routes
are reserved cut-through on the collective's links, so uniform powers of two give exactly
the closed form and other groups and mixed links match the detailed model within a
percent. Analytic collectives charge every link the same bytes as the detailed model but
do not contend with other traffic.

Messages go through a transport (:mod:`simcore.transport`), which adds what the hosts
cost them: on CPU hosts every collective runs as its messages whatever the fidelity
(their CPU competes with the ranks' compute), a ring's sends travel as the library's
segments and its reduce-scatter's are summed on arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simcore.network import LinkState, Message, Network, reserve_cut_through
from simcore.topology import Link
from simcore.transport import SendFn, Transport

ALLREDUCE_ALGORITHMS = ("ring", "tree", "hierarchical")
"""All-reduce algorithms a scheme may ask for."""

Step = list[tuple[int, int, int]]
"""One step of an algorithm: ``(src_position, dst_position, nbytes)`` sends."""

CostModel = tuple[float, float, list[tuple[int, float]], float]
"""See :meth:`Collectives.cost_model`."""

MessagePlan = tuple[tuple[tuple[tuple[int, int, int], ...], ...], int]
"""See :meth:`Collectives.message_plan`."""


def _split(n: int, parts: int) -> list[int]:
    q, r = divmod(n, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


# ---- algorithms as lists of steps, over positions 0..q-1 ------------------------------


def ring_step(q: int, n: int, s: int = 0) -> Step:
    """Step ``s`` of a ring over ``q`` positions moving ``n/q``-byte segments: position
    ``i`` sends segment ``i - s`` to ``i + 1``."""
    seg = _split(n, q)
    return [(i, (i + 1) % q, seg[(i - s) % q]) for i in range(q)]


def ring_bytes_sent(position: int, q: int, n: int) -> int:
    """Bytes position ``position`` of a ``q``-position ring all-reduce of ``n`` bytes sends
    (its ``2(q-1)`` segments, each ``n/q`` rounded as :func:`ring_step` cuts them): what a
    real rank counts for the collective, exactly as the simulated messages carry."""
    if q <= 1:
        return 0
    seg = _split(n, q)
    return sum(seg[(position - s) % q] for s in range(2 * (q - 1)))


def ring_allreduce_steps(q: int, n: int) -> list[Step]:
    """Ring all-reduce: ``2(q-1)`` steps; position ``i`` sends to ``i+1``."""
    return [ring_step(q, n, s) for s in range(2 * (q - 1))]


def ring_half_steps(q: int, n: int) -> list[Step]:
    """Ring reduce-scatter (or all-gather): ``q-1`` steps of ``n/q`` bytes."""
    return [ring_step(q, n, s) for s in range(q - 1)]


def tree_reduce_steps(q: int, n: int) -> list[Step]:
    """Binomial-tree reduce to position 0: ``ceil(log2 q)`` steps of ``n`` bytes."""
    steps: list[Step] = []
    mask = 1
    while mask < q:
        steps.append([(i, i - mask, n) for i in range(mask, q, 2 * mask)])
        mask <<= 1
    return steps


def tree_broadcast_steps(q: int, n: int) -> list[Step]:
    """Binomial-tree broadcast from position 0 (the reduce's steps, reversed)."""
    return [[(d, s, b) for s, d, b in step] for step in reversed(tree_reduce_steps(q, n))]


def flat_broadcast_steps(q: int, n: int) -> list[Step]:
    """The root sends ``q-1`` full copies (gloo's broadcast)."""
    return [[(0, i, n) for i in range(1, q)]] if q > 1 else []


def _merge(parallel: list[list[Step]]) -> list[Step]:
    """Run several step lists side by side (step k of each in step k)."""
    depth = max((len(p) for p in parallel), default=0)
    return [[m for p in parallel if k < len(p) for m in p[k]] for k in range(depth)]


def _lift(steps: list[Step], positions: Sequence[int]) -> list[Step]:
    """Re-address steps over local positions to global positions."""
    return [[(positions[s], positions[d], b) for s, d, b in step] for step in steps]


def hierarchical_steps(groups: Sequence[Sequence[int]], n: int) -> list[Step]:
    """Tree reduce inside each group (positions), ring all-reduce of the groups' first
    positions, tree broadcast inside each group."""
    leaders = [g[0] for g in groups]
    reduce_ = _merge([_lift(tree_reduce_steps(len(g), n), g) for g in groups])
    across = _lift(ring_allreduce_steps(len(leaders), n), leaders) if len(leaders) > 1 else []
    bcast = _merge([_lift(tree_broadcast_steps(len(g), n), g) for g in groups])
    return reduce_ + across + bcast


# ---- the collective engine -----------------------------------------------------------


class Collectives:
    """Runs collectives on a :class:`~simcore.network.Network` for ranks of a topology,
    sending through ``transport`` (the null :class:`~simcore.transport.Transport` when
    not given: a GPU cluster's).

    Every operation takes the ranks of the group (their order is the ring order), the
    bytes ``n`` each rank contributes, and ``on_done(time)`` called when every rank has
    finished. ``tag`` labels the messages; ``iteration`` is recorded with them.
    """

    def __init__(self, net: Network, transport: Transport | None = None) -> None:
        self.net = net
        self.transport = transport if transport is not None else Transport(net)
        self.topology = net.topology
        self._costs: dict[tuple[str, tuple[int, ...]], CostModel] = {}
        self._plans: dict[tuple[str, tuple[int, ...], int], MessagePlan] = {}
        self._durations: dict[tuple[str, tuple[int, ...], int], float] = {}
        self.records: list[tuple[str, tuple[int, ...], int, float, float, int, str]] = []
        """``(op, ranks, nbytes, start_s, end_s, iteration, tag)`` of each collective."""

    # public operations
    def allreduce(
        self,
        ranks: Sequence[int],
        n: int,
        algorithm: str,
        on_done: Callable[[float], None],
        tag: str = "allreduce",
        iteration: int = -1,
    ) -> None:
        """All-reduce ``n`` bytes over ``ranks`` with ``algorithm`` (see module docs)."""
        if algorithm not in ALLREDUCE_ALGORITHMS:
            raise ValueError(
                f"unknown all-reduce algorithm {algorithm!r}; choose one of "
                f"{', '.join(ALLREDUCE_ALGORITHMS)}"
            )
        self._run("allreduce-" + algorithm, tuple(ranks), int(n), on_done, tag, iteration)

    def reduce_scatter(
        self,
        ranks: Sequence[int],
        n: int,
        on_done: Callable[[float], None],
        tag: str = "reduce_scatter",
        iteration: int = -1,
    ) -> None:
        """Ring reduce-scatter of ``n`` bytes (each rank ends with ``n/p`` reduced)."""
        self._run("ring-half", tuple(ranks), int(n), on_done, tag, iteration)

    def allgather(
        self,
        ranks: Sequence[int],
        n: int,
        on_done: Callable[[float], None],
        tag: str = "allgather",
        iteration: int = -1,
    ) -> None:
        """Ring all-gather to ``n`` bytes in total (each rank contributes ``n/p``)."""
        self._run("ring-half", tuple(ranks), int(n), on_done, tag, iteration)

    def broadcast(
        self,
        ranks: Sequence[int],
        n: int,
        on_done: Callable[[float], None],
        flat: bool = False,
        tag: str = "broadcast",
        iteration: int = -1,
    ) -> None:
        """Broadcast ``n`` bytes from ``ranks[0]`` (binomial tree, or ``flat``)."""
        self._run(
            "broadcast-flat" if flat else "broadcast-tree",
            tuple(ranks),
            int(n),
            on_done,
            tag,
            iteration,
        )

    # planning
    def phases(self, op: str, ranks: tuple[int, ...], n: int) -> list[tuple[Step, int]]:
        """The steps of ``op`` over positions ``0..len(ranks)-1`` as ``(step, repeat)``
        pairs (a ring's identical steps appear once, with their count)."""
        q = len(ranks)
        if op == "allreduce-ring":
            return [(ring_step(q, n), 2 * (q - 1))] if q > 1 else []
        if op == "allreduce-tree":
            return [(st, 1) for st in tree_reduce_steps(q, n) + tree_broadcast_steps(q, n)]
        if op == "allreduce-hierarchical":
            box = self.topology.box_of_rank
            groups: dict[int, list[int]] = {}
            for pos, r in enumerate(ranks):
                groups.setdefault(box(r), []).append(pos)
            members = list(groups.values())
            leaders = [g[0] for g in members]
            reduce_ = _merge([_lift(tree_reduce_steps(len(g), n), g) for g in members])
            bcast = _merge([_lift(tree_broadcast_steps(len(g), n), g) for g in members])
            across = (
                [(_lift([ring_step(len(leaders), n)], leaders)[0], 2 * (len(leaders) - 1))]
                if len(leaders) > 1
                else []
            )
            return [(st, 1) for st in reduce_] + across + [(st, 1) for st in bcast]
        if op == "ring-half":
            return [(ring_step(q, n), q - 1)] if q > 1 else []
        if op == "broadcast-tree":
            return [(st, 1) for st in tree_broadcast_steps(q, n)]
        if op == "broadcast-flat":
            return [(st, 1) for st in flat_broadcast_steps(q, n)]
        raise ValueError(f"unknown collective {op!r}")

    def steps(self, op: str, ranks: tuple[int, ...], n: int) -> list[Step]:
        """Every step of ``op`` over positions ``0..len(ranks)-1``, in order, with the
        exact (integer) message sizes for ``n`` bytes."""
        q = len(ranks)
        if op == "allreduce-ring":
            return ring_allreduce_steps(q, n)
        if op == "ring-half":
            return ring_half_steps(q, n)
        if op == "allreduce-hierarchical":
            box = self.topology.box_of_rank
            groups: dict[int, list[int]] = {}
            for pos, r in enumerate(ranks):
                groups.setdefault(box(r), []).append(pos)
            return hierarchical_steps(list(groups.values()), n)
        return [st for st, rep in self.phases(op, ranks, n) for _ in range(rep)]

    def message_plan(self, op: str, ranks: tuple[int, ...], n: int) -> MessagePlan:
        """Each position's sends of ``op`` as ``(threshold, dst_position, nbytes)`` in step
        order, ``threshold`` being how many messages the position must have received before
        it sends (everything addressed to it in earlier steps), and the total number of
        messages. Cached: a bucket is reduced with the same plan every iteration."""
        key = (op, ranks, n)
        plan = self._plans.get(key)
        if plan is None:
            q = len(ranks)
            sends: list[list[tuple[int, int, int]]] = [[] for _ in range(q)]
            expected = [0] * q
            total = 0
            for step in self.steps(op, ranks, n):
                for s, d, b in step:
                    sends[s].append((expected[s], d, b))
                for _s, d, _b in step:
                    expected[d] += 1
                total += len(step)
            plan = self._plans[key] = (tuple(tuple(x) for x in sends), total)
        return plan

    def _run(
        self,
        op: str,
        ranks: tuple[int, ...],
        n: int,
        on_done: Callable[[float], None],
        tag: str,
        iteration: int,
    ) -> None:
        env = self.net.env
        start = env.now
        record = self.records

        def finish(t: float) -> None:
            record.append((op, ranks, n, start, t, iteration, tag))
            on_done(t)

        if len(ranks) <= 1 or n <= 0:
            ev = env.timeout(0)
            ev.callbacks.append(lambda _e: finish(env.now))
            return
        transport = self.transport
        if transport.closed_form:
            self._run_analytic(op, ranks, n, finish)
            return
        runner = _StepRunner(
            self.net,
            self.topology.gpus,
            ranks,
            self.message_plan(op, ranks, n),
            finish,
            tag,
            iteration,
        )
        if op in ("allreduce-ring", "ring-half"):
            q = len(ranks)
            segments = transport.ring_segments(n, q)
            runner.send = transport.collective_sender(segments)
            runner.send_reduced = transport.collective_sender(segments, reduces=True)
            runner.reducing = q - 1  # the reduce-scatter's sends are summed on arrival
        else:
            runner.send = runner.send_reduced = transport.collective_sender()
        runner.start()

    # analytic fidelity
    def _run_analytic(
        self, op: str, ranks: tuple[int, ...], n: int, finish: Callable[[float], None]
    ) -> None:
        _fixed, _per_byte, link_factors, _payload = self.cost_model(op, ranks)
        duration = self.duration(op, ranks, n)
        states = self.net.state
        for idx, factor in link_factors:
            st = states[idx]
            moved = round(factor * n)
            st.sent_bytes += moved
            st.recv_bytes += moved
        env = self.net.env
        ev = env.timeout(duration)
        ev.callbacks.append(lambda _e: finish(env.now))

    def cost_model(self, op: str, ranks: tuple[int, ...]) -> CostModel:
        """``(fixed_s, per_byte_s, [(link_index, bytes_per_input_byte)], payload_factor)``
        of ``op`` on ``ranks``: the closed-form duration is ``fixed_s + per_byte_s * n``;
        the algorithm's messages carry ``payload_factor * n`` bytes in all. Cached."""
        key = (op, ranks)
        hit = self._costs.get(key)
        if hit is None:
            hit = self._costs[key] = self._plan_cost(op, ranks)
        return hit

    def duration(self, op: str, ranks: tuple[int, ...], n: int) -> float:
        """The analytic duration of ``op`` on ``ranks`` for ``n`` bytes, seconds. Cached.

        Ring phases (identical steps) take their closed form, ``repeat`` times the slowest
        send's ``latency + bytes / bandwidth share``. Other steps (trees, broadcasts) are
        walked send by send in step order: a send starts once its sender has received
        everything addressed to it in earlier steps, and its route is reserved link by
        link, cut-through (as in :class:`~simcore.network.AnalyticNetwork`), on links
        only this collective uses. So a rank with nothing to wait for goes at once, as in
        the detailed model, and sends that meet on a link queue there.
        """
        key = (op, ranks, n)
        d = self._durations.get(key)
        if d is None:
            d = self._durations[key] = self._walk(op, ranks, n)
        return d

    def _walk(self, op: str, ranks: tuple[int, ...], n: int) -> float:
        phases = self.phases(op, ranks, n)
        if all(repeat > 1 for _step, repeat in phases):
            fixed, per_byte, _factors, _payload = self.cost_model(op, ranks)
            return fixed + per_byte * n
        topo = self.topology
        gpus = topo.gpus
        ready = [0.0] * len(ranks)
        scratch: dict[int, LinkState] = {}  # this collective's own reservations
        states = self.net.state
        for step, repeat in phases:
            routes = [topo.route(gpus[ranks[s]], gpus[ranks[d]]) for s, d, _b in step]
            if repeat > 1:
                # A ring phase: it starts when all its members are ready.
                members = {s for s, _d, _b in step} | {d for _s, d, _b in step}
                start = max(ready[m] for m in members)
                end = start + repeat * _slowest_send(step, routes, states)
                for m in members:
                    ready[m] = end
                continue
            arrivals = []
            for k in sorted(range(len(step)), key=lambda k: ready[step[k][0]]):
                s, d, b = step[k]
                arrivals.append((d, _reserve(routes[k], b, ready[s], scratch, states)))
            for d, t in arrivals:
                if t > ready[d]:
                    ready[d] = t
        return max(ready)

    def payload_factor(self, op: str, ranks: tuple[int, ...]) -> float:
        """Bytes the algorithm's messages carry per byte of input."""
        return self.cost_model(op, ranks)[3]

    def _plan_cost(self, op: str, ranks: tuple[int, ...]) -> CostModel:
        topo = self.topology
        gpus = topo.gpus
        unit = 1 << 20  # plan with n = unit * p bytes, then scale to bytes of input
        phases = self.phases(op, ranks, unit * len(ranks))
        scale = 1.0 / (unit * len(ranks))
        fixed = 0.0
        per_byte = 0.0
        payload = 0.0
        factors: dict[int, float] = {}
        states = self.net.state
        for step, repeat in phases:
            use: dict[int, int] = {}
            routes = []
            for s, d, b in step:
                route = topo.route(gpus[ranks[s]], gpus[ranks[d]])
                routes.append((route, b))
                for link in route:
                    use[link.index] = use.get(link.index, 0) + 1
            step_alpha = 0.0
            step_time = 0.0
            for route, b in routes:
                payload += b * scale * repeat
                if not route:
                    continue
                step_alpha = max(step_alpha, sum(link.latency for link in route))
                share = min(_rate(link, states) / use[link.index] for link in route)
                step_time = max(step_time, b * scale / share)
                for link in route:
                    factors[link.index] = factors.get(link.index, 0.0) + b * scale * repeat
            fixed += step_alpha * repeat
            per_byte += step_time * repeat
        return fixed, per_byte, sorted(factors.items()), payload


def _rate(link: Link, states: Sequence[LinkState]) -> float:
    """``link``'s rate in this run (its bandwidth times its state's rate factor)."""
    return link.bandwidth_bytes_per_s * states[link.index].rate_factor


def _slowest_send(step: Step, routes: list[tuple[Link, ...]], states: Sequence[LinkState]) -> float:
    """The longest ``latency + bytes / bandwidth share`` among a step's sends, a link used
    by ``k`` of them giving each ``1/k`` of its rate in this run."""
    use: dict[int, int] = {}
    for route in routes:
        for link in route:
            use[link.index] = use.get(link.index, 0) + 1
    slowest = 0.0
    for (_s, _d, b), route in zip(step, routes, strict=True):
        if route:
            share = min(_rate(link, states) / use[link.index] for link in route)
            slowest = max(slowest, sum(link.latency for link in route) + b / share)
    return slowest


def _reserve(
    route: tuple[Link, ...],
    nbytes: int,
    start: float,
    scratch: dict[int, LinkState],
    states: Sequence[LinkState],
) -> float:
    """Arrival time of ``nbytes`` sent at ``start`` over ``route``, reserved cut-through
    (:func:`simcore.network.reserve_cut_through`) on the scratch link states of one
    collective (link index -> state), each at its link's rate in this run (``states``)."""
    if not route or nbytes <= 0:
        return start
    hops = [
        scratch.get(link.index)
        or scratch.setdefault(link.index, LinkState(link, states[link.index].rate_factor))
        for link in route
    ]
    return reserve_cut_through(hops, nbytes, start)[1]


class _StepRunner:
    """Executes a step list as messages. A position sends its message of step ``t`` once
    it has received every message addressed to it in steps before ``t``: each position
    keeps its sends in step order with that count as threshold, and an arrival releases
    the sends whose threshold it reaches."""

    __slots__ = (
        "arrived",
        "finish",
        "gpus",
        "iteration",
        "left",
        "net",
        "next_send",
        "plan",
        "ranks",
        "reducing",
        "send",
        "send_reduced",
        "tag",
    )

    def __init__(
        self,
        net: Network,
        gpus: list[int],
        ranks: tuple[int, ...],
        plan: MessagePlan,
        finish: Callable[[float], None],
        tag: str,
        iteration: int,
    ) -> None:
        self.net, self.gpus, self.ranks, self.finish = net, gpus, ranks, finish
        self.tag, self.iteration = tag, iteration
        q = len(ranks)
        self.plan, total = plan
        self.next_send = [0] * q
        self.arrived = [0] * q
        self.left = total
        self.send: SendFn = net.send
        """The transport's send of the collective's messages."""
        self.send_reduced: SendFn = net.send
        """The transport's send of messages the receiver sums into its buffer."""
        self.reducing = 0
        """Each position's first sends whose payload the receiver sums into its buffer."""

    def start(self) -> None:
        if self.left == 0:
            self.finish(self.net.env.now)
            return
        for pos in range(len(self.plan)):
            self._release(pos)

    def _release(self, pos: int) -> None:
        sends = self.plan[pos]
        k = self.next_send[pos]
        have = self.arrived[pos]
        ranks, gpus, reducing = self.ranks, self.gpus, self.reducing
        while k < len(sends) and sends[k][0] <= have:
            _, d, b = sends[k]
            rs, rd = ranks[pos], ranks[d]
            (self.send_reduced if k < reducing else self.send)(
                gpus[rs], gpus[rd], b, self._arrived, 0.0, self.tag, rs, rd, self.iteration, d
            )
            k += 1
        self.next_send[pos] = k

    def _arrived(self, msg: Message) -> None:
        d = msg.payload
        self.arrived[d] += 1
        self._release(d)
        self.left -= 1
        if self.left == 0:
            self.finish(self.net.env.now)
