"""``gossip``: GossipGraD (Daily et al., "GossipGraD: Scalable Deep Learning using Gossip
Communication based Asynchronous Gradient Descent", 2018).

Every iteration each worker exchanges its model state with one partner instead of
all-reducing gradients, so a worker sends the same bytes per iteration whatever the
number of workers ``p`` (a power of two).

**What is exchanged** (``exchange``):

* ``weights`` (default; the authors' final versions, matex-org's Caffe forks): at the
  start of iteration ``t`` a worker sets its weights and its optimizer state (SGD's
  momentum) to the mean of its own and those its partner of iteration ``t - 1`` sent at
  the start of ``t - 1`` (one iteration old), then sends the result to its partner of
  ``t``; it then trains ``t`` on its own gradient. A message carries the weights and the
  optimizer state: twice the parameters with SGD momentum.
* ``gradients``: each layer's gradient goes to the partner as backward produces it; just
  before the layer's next forward the worker averages it with the partner's
  (``g = (g + g_partner) / 2``) and steps the layer with its own optimizer state.
* ``gradients+weights`` (the authors' version 1): as ``gradients``, and each message also
  carries the layer's weights of the same iteration; before the step the worker sets the
  layer's weights to the mean of its own and its partner's.

**Partners.** Iteration ``t`` is step ``h = t mod log2(p)`` of cycle ``c = t div
log2(p)`` and uses distance ``d = 2**h`` on *virtual* ranks ``v = pi_c(r)``:

* ``hypercube``: exchange with ``v XOR d`` (send to and receive from the same partner);
* ``dissemination``: send to ``(v - d) mod p``, receive from ``(v + d) mod p``.

Within a cycle both schedules average ``p`` models to their mean in ``log2(p)`` steps.
After every cycle the virtual ranks rotate (``rotation``):

* ``singer`` (default): ``pi_c(r) = r * x**c`` in the field GF(2**log2 p) (ranks read as
  polynomials over GF(2)); one step is a shift of the rank's bits with feedback, a
  rotation of the ``p - 1`` non-zero ranks through a single cycle (a Singer cycle). A
  hypercube step then pairs ranks whose XOR is ``x**(h - c)``, so over ``p - log2(p)``
  cycles every pair has exchanged directly; the dissemination schedule was checked to do
  so within ``p - 1`` cycles for ``p`` up to 1024.
* ``random``: ``pi_c`` is permutation ``c mod p`` of a fixed list of ``p`` permutations,
  the identity and ``p - 1`` drawn from a seeded generator (the same on every rank);
  the authors' latest versions draw ``p - 1`` permutations on rank 0, broadcast them and
  cycle through them.
* ``shift``: ``pi_c(r) = (r - c) mod p``, the authors' early versions. Partners then
  always differ by ``+-2**h (mod p)``: for ``p >= 8`` some pairs (e.g. ranks 0 and 3)
  never meet directly, contrary to the rotation's stated purpose; it only changes which
  of those pairs meet when.
* ``none``: no rotation.

**Timing.** ``gradients`` and ``gradients+weights``: each layer's message is sent as soon
as backward produces its gradient, asynchronously with compute; the partner's message of
a layer is averaged in and the layer updated just before the layer's next forward, which
waits for it if it has not arrived. ``weights``: at the start of an iteration the worker
waits for its last partner's messages (one per layer), averages them in, sends its own,
and runs forward, backward and its optimizer step; the messages travel during that
compute and the next iteration's start waits for any still missing. With ``shuffle``,
each worker also sends its input batch to its partner while it runs forward (GossipGraD's
asynchronous sample shuffle); the batch received is the one the next iteration's forward
waits for. An iteration of a worker ends when its own work is done and all of its
partner's messages of the iteration are in.

No barrier couples the workers: a worker only ever waits for its partner of the previous
iteration, so a slow worker delays its partners and only them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

from simpy import Event

from simcore.config import OPTIMIZERS, ConfigError, SimConfig, option
from simcore.device import Gpu
from simcore.network import Message
from simcore.records import UPDATE
from simcore.schemes._ops import LayerOps
from simcore.schemes.base import Scheme
from simcore.topology import Topology
from simcore.work import SchemeWork, Workload

SCHEDULES = ("hypercube", "dissemination")
"""Partner schedules (see module docs)."""

ROTATIONS = ("singer", "random", "shift", "none")
"""Rotations of the virtual ranks after each cycle (see module docs)."""

EXCHANGES = ("weights", "gradients", "gradients+weights")
"""What partners exchange and average (see module docs)."""

AVERAGE_PASSES = 3
"""Weight-sized memory passes to average one array with the partner's: read both, write
one."""

PACK_PASSES = 2
"""Weight-sized memory passes to pack one array into a message, exchanging weights (the
real runtime copies a layer's weights and optimizer state into one buffer per message):
read it, write it."""

RANDOM_ROTATION_SEED = 20180219
"""Seed of the ``random`` rotation's permutations (any fixed value: every rank and the
simulator draw the same ones)."""


@dataclass(frozen=True)
class GossipOptions:
    """Options of ``gossip``."""

    schedule: str = option(
        "hypercube",
        "partner schedule: exchange with rank XOR 2^h, or send to r-2^h and receive from r+2^h",
        choices=SCHEDULES,
    )
    exchange: str = option(
        "weights",
        "what partners average: weights and optimizer state, one iteration old (the "
        "authors' final versions); gradients; or gradients and weights (their version 1)",
        choices=EXCHANGES,
    )
    rotation: str = option(
        "singer",
        "how virtual ranks rotate after each cycle of log2(p) steps (random: the authors' "
        "latest versions, seeded; shift: their early ones)",
        choices=ROTATIONS,
    )
    shuffle: bool = option(
        True,
        "send the input batch to the partner during forward "
        "(GossipGraD's asynchronous sample shuffle)",
    )
    mean_field: str = option(
        "auto",
        "analytic fidelity: simulate two machines and mirror "
        "them onto the rest where the cluster and the partners "
        "are symmetric (exact); auto: from 4 machines, on: "
        "wherever it applies, off: every worker",
        choices=("auto", "on", "off"),
    )


# ---- partner schedules -----------------------------------------------------------------


def is_power_of_two(n: int) -> bool:
    """Whether ``n`` is 1, 2, 4, 8, ..."""
    return n >= 1 and n & (n - 1) == 0


def _gf2_mulmod(a: int, b: int, poly: int, bits: int) -> int:
    """``a * b`` modulo ``poly`` for polynomials over GF(2) held as bit masks."""
    out = 0
    while b:
        if b & 1:
            out ^= a
        b >>= 1
        a <<= 1
        if a >> bits:
            a ^= poly
    return out


def _gf2_xpow(e: int, poly: int, bits: int) -> int:
    """``x**e`` modulo ``poly`` over GF(2)."""
    out, base = 1, 2 if bits > 1 else 1
    while e:
        if e & 1:
            out = _gf2_mulmod(out, base, poly, bits)
        base = _gf2_mulmod(base, base, poly, bits)
        e >>= 1
    return out


def _prime_factors(n: int) -> list[int]:
    out, q = [], 2
    while q * q <= n:
        if n % q == 0:
            out.append(q)
            while n % q == 0:
                n //= q
        q += 1
    if n > 1:
        out.append(n)
    return out


@cache
def primitive_polynomial(bits: int) -> int:
    """The smallest primitive polynomial of degree ``bits`` over GF(2), as a bit mask
    (bit ``bits`` set): ``x`` has order ``2**bits - 1`` modulo it."""
    if bits < 1:
        raise ValueError(f"bits must be at least 1, got {bits}")
    if bits == 1:
        return 0b11
    order = (1 << bits) - 1
    factors = _prime_factors(order)
    for poly in range((1 << bits) | 1, 1 << (bits + 1), 2):
        if _gf2_xpow(order, poly, bits) == 1 and all(
            _gf2_xpow(order // q, poly, bits) != 1 for q in factors
        ):
            return poly
    raise ValueError(f"no primitive polynomial of degree {bits}")  # cannot happen


@cache
def random_permutation(p: int, k: int) -> tuple[int, ...]:
    """Permutation ``k`` (``0 <= k < p``) of the ``random`` rotation: the identity for
    ``k = 0``, else a shuffle of ``0..p-1`` drawn from :data:`RANDOM_ROTATION_SEED`,
    ``p`` and ``k``."""
    perm = list(range(p))
    if k:
        random.Random((RANDOM_ROTATION_SEED * 1_000_003 + p) * 1_000_033 + k).shuffle(perm)
    return tuple(perm)


def virtual_ranks(p: int, cycle: int, rotation: str = "singer") -> list[int]:
    """``pi_c``: the virtual rank of every rank ``0..p-1`` in cycle ``cycle``."""
    if rotation == "none" or p == 1:
        return list(range(p))
    if rotation == "shift":
        return [(r - cycle) % p for r in range(p)]
    if rotation == "random":
        return list(random_permutation(p, cycle % p))
    if rotation != "singer":
        raise ValueError(f"unknown rotation {rotation!r}; choose one of {', '.join(ROTATIONS)}")
    bits = p.bit_length() - 1
    poly = primitive_polynomial(bits)
    factor = _gf2_xpow(cycle % (p - 1), poly, bits)
    return [_gf2_mulmod(r, factor, poly, bits) for r in range(p)]


def partners(
    p: int, step: int, schedule: str = "hypercube", rotation: str = "singer"
) -> tuple[list[int], list[int]]:
    """``(send_to, recv_from)``: for every rank, whom it sends to and receives from in
    iteration ``step`` (``p`` a power of two; one worker has no partner: itself)."""
    if not is_power_of_two(p):
        raise ValueError(f"gossip needs a power-of-two number of ranks, got {p}")
    if p == 1:
        return [0], [0]
    bits = p.bit_length() - 1
    d = 1 << (step % bits)
    pi = virtual_ranks(p, step // bits, rotation)
    inv = [0] * p
    for r, v in enumerate(pi):
        inv[v] = r
    if schedule == "hypercube":
        mate = [inv[v ^ d] for v in pi]
        return mate, mate
    if schedule == "dissemination":
        return [inv[(v - d) % p] for v in pi], [inv[(v + d) % p] for v in pi]
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


# ---- the scheme --------------------------------------------------------------------------


class Gossip(Scheme):
    """GossipGraD (see module docs)."""

    name = "gossip"
    summary = (
        "GossipGraD: partners average weights and momentum, one rotating partner per "
        "iteration (hypercube or dissemination), asynchronous"
    )
    Options = GossipOptions
    replicas_diverge = True
    posts_sends = True
    real_runtime = "realrun.schemes.gossip:GossipRuntime"
    convergence_variants = MappingProxyType(
        {
            "gossip": {},
            "gossip-gradients": {"exchange": "gradients"},
            "gossip-gradients+weights": {"exchange": "gradients+weights"},
        }
    )

    @classmethod
    def step_passes(cls, optimizer: str, gpus: int, exchange: str = "weights") -> int:
        """Weight-sized memory passes of a worker's updates in one iteration: the
        optimizer's, plus, when it has a partner, the averages of what the partners
        exchange (:func:`average_passes`)."""
        return OPTIMIZERS[optimizer][1] + (average_passes(optimizer, exchange) if gpus > 1 else 0)

    @classmethod
    def check(cls, config: SimConfig, options: Any, topology: Topology) -> None:
        p = topology.num_gpus
        why = cls.worker_refusal(p)
        if why is not None:
            raise ConfigError("gpus", p, f"gossip {why}")
        if options.mean_field == "on":
            plan = mirror_plan(config, options, topology)
            if isinstance(plan, str):
                raise ConfigError("scheme.mean_field", "on", plan)

    @classmethod
    def worker_refusal(cls, workers: int) -> str | None:
        """A power of two (the hypercube's partners), else the nearest two."""
        if is_power_of_two(workers):
            return None
        lower = 1 << (workers.bit_length() - 1)
        return f"pairs workers on a hypercube and needs a power of two, e.g. {lower} or {2 * lower}"

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """A message per layer with parameters, and one more, per worker and iteration,
        each worker sending its parameters' bytes."""
        p, its = work.gpus, work.iterations
        return SchemeWork(
            messages=its * p * (len(work.param_bytes) + 1),
            moved_bytes=its * float(sum(work.param_bytes)) * p,
        )

    def start(self) -> None:
        ctx = self.ctx
        trace = ctx.trace
        opts: GossipOptions = self.options
        self.p = p = ctx.num_ranks
        self.mirror = None
        if opts.mean_field != "off":
            plan = mirror_plan(ctx.config, opts, ctx.topology)
            if not isinstance(plan, str) and (
                opts.mean_field == "on" or plan[1] >= MIRROR_MIN_MACHINES
            ):
                self.mirror = plan
        simulated = p if self.mirror is None else 2 * self.mirror[0]
        self.simulated = simulated
        self.ops = LayerOps(trace)
        self.grads = [i for _d, _n, i in self.ops.fwd if trace.layers[i].param_bytes > 0]
        self.slot = {layer: k for k, layer in enumerate(self.grads)}
        self.shuffle_bytes = (
            sum(layer.activation_bytes for layer in trace.layers if layer.kind == "input")
            if opts.shuffle and p > 1
            else 0
        )
        self.shuffle_slot = len(self.grads)  # the slot of the shuffled batch
        optimizer = ctx.config.optimizer
        self.exchange = opts.exchange if p > 1 else "gradients"  # alone: plain steps
        self.by_weights = self.exchange == "weights"
        self.copies = exchanged_copies(optimizer, self.exchange)
        bw = ctx.topology.gpu_spec.memory_bandwidth_bytes_per_s
        # weights: the average at the iteration's start and the step after backward are
        # two ops; gradients (+weights): one op before the layer's next forward
        step = OPTIMIZERS[optimizer][1]
        mix = average_passes(optimizer, self.exchange) if p > 1 else 0
        if self.by_weights:
            self.update_s = {i: step * trace.layers[i].param_bytes / bw for i in self.grads}
            self.average_s = {i: mix * trace.layers[i].param_bytes / bw for i in self.grads}
            pack = PACK_PASSES * self.copies if p > 1 else 0
            self.pack_s = {i: pack * trace.layers[i].param_bytes / bw for i in self.grads}
        else:
            self.update_s = {i: (step + mix) * trace.layers[i].param_bytes / bw for i in self.grads}
            self.average_s = {}
        self._updates: dict[int, dict[int, tuple[Any, ...]]] = {}
        self._partners: dict[int, tuple[list[int], list[int]]] = {}
        self.post = ctx.transport.post
        # Arrival time of each slot per (rank, iteration), -1 until known; what is left;
        # who waits for which slot; when backward ended.
        self.arrival: dict[tuple[int, int], list[float]] = {}
        expected = len(self.grads) if p > 1 else 0
        self.left = {(r, it): expected for r in range(simulated) for it in range(ctx.iterations)}
        self.waiting: dict[tuple[int, int, int], Event] = {}
        self.bwd_end: dict[tuple[int, int], float] = {}
        # Receive window: ``(r, it, slot)`` once rank ``r`` has used that message (its
        # receive for the next iteration's is then posted) until the next one is sent,
        # and the sends held until then.
        self.used: set[tuple[int, int, int]] = set()
        self.held: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        pb = trace.param_bytes
        if self.mirror is not None:
            ctx.traffic_scale = p / simulated
        for r in range(simulated):
            mem = ctx.gpus[r].memory
            mem.alloc("weights", pb)
            mem.alloc("gradients", pb)
            mem.alloc("optimizer", ctx.optimizer_state_bytes(pb))
            if p > 1:  # the partner's message, its batch
                mem.alloc("buffers", self.copies * pb + self.shuffle_bytes)
            ctx.env.process(self._worker(r))

    def partners_of(self, it: int) -> tuple[list[int], list[int]]:
        """``(send_to, recv_from)`` of every rank in iteration ``it`` (cached); in the
        mean field, of the simulated ranks, a partner on another machine being the rank in
        its place on the other simulated machine."""
        hit = self._partners.get(it)
        if hit is None:
            opts: GossipOptions = self.options
            hit = partners(self.p, it, opts.schedule, opts.rotation)
            if self.mirror is not None:
                g = self.mirror[0]
                hit = tuple(
                    [
                        q if q // g == r // g else (1 - r // g) * g + q % g
                        for r, q in enumerate(side[: 2 * g])
                    ]
                    for side in hit
                )
            self._partners[it] = hit
        return hit

    def finish(self) -> None:
        """Mean field: every rank not simulated takes its twin's iteration ends, compute
        and memory; links of the machines not simulated take their twin's counters."""
        if self.mirror is None:
            return
        g, _boxes, twins = self.mirror
        ctx = self.ctx
        ends = ctx.iteration_end
        for r in range(2 * g, self.p):
            t = (r // g % 2) * g + r % g
            gpu, twin = ctx.gpus[r], ctx.gpus[t]
            gpu.busy_by_iteration = dict(twin.busy_by_iteration)
            gpu.ops = twin.ops
            gpu.memory = twin.memory
            for row in ends:
                row[r] = row[t]
        ctx.net.copy_counters(twins)

    # ---- worker --------------------------------------------------------------------------
    def _worker(self, r: int) -> Any:
        ctx = self.ctx
        env = ctx.env
        gpu = ctx.gpus[r]
        mem = gpu.memory
        act = ctx.trace.activation_bytes
        by_weights = self.by_weights
        has_grad = _never if by_weights else self.slot.__contains__
        for it in range(ctx.iterations):
            if by_weights and self.p > 1:
                # The last partner's weights and state averaged in, then ours sent.
                # Iteration ``it``'s receives (the batch's too) are posted together once
                # every layer of ``it - 1`` is mixed in, before this worker's model goes.
                if it > 0:
                    for slot in range(len(self.grads)):
                        yield from self._wait_for(r, it - 1, slot, gpu)
                    yield gpu.compute_seq([self._average_op(layer, it) for layer in self.grads])
                    for slot in range(self.shuffle_slot + (1 if self.shuffle_bytes else 0)):
                        self._use(r, it - 1, slot)
                for slot, layer in enumerate(self.grads):  # each layer packed, then sent
                    yield gpu.compute_seq([self._pack_op(layer, it)])
                    self._send(r, it, slot)
            # Forward: the batch shuffled in last iteration, then layer by layer (with
            # gradients, each layer after its averaged update of the last iteration).
            if self.shuffle_bytes:
                self._send(r, it, self.shuffle_slot)
                if it > 0:
                    yield from self._wait_for(r, it - 1, self.shuffle_slot, gpu)
                    if not (by_weights and self.p > 1):
                        self._use(r, it - 1, self.shuffle_slot)
            for layer, run in self.ops.forward_runs(it, has_grad):
                if layer >= 0 and it > 0:
                    if self.p > 1:
                        yield from self._wait_for(r, it - 1, self.slot[layer], gpu)
                        self._use(r, it - 1, self.slot[layer])
                    gpu.enqueue([self._update_op(layer, it)])
                gpu.enqueue(run)
            mem.alloc("activations", act)
            # Backward: with gradients, every layer's message goes to the partner as soon
            # as its gradient exists.
            for layer, run in self.ops.backward_runs(it, has_grad):
                yield gpu.compute_seq(run)
                if layer >= 0 and self.p > 1:
                    self._send(r, it, self.slot[layer])
            mem.free("activations", act)
            if by_weights:  # the optimizer step, layer by layer in forward order
                yield gpu.compute_seq([self._update_op(layer, it) for layer in self.grads])
            self.bwd_end[(r, it)] = env.now
            self._maybe_done(r, it)

    def _average_op(self, layer: int, it: int) -> tuple[Any, ...]:
        """The op that averages the partner's weights and state of ``layer`` in at the
        start of iteration ``it``."""
        return (
            self.average_s[layer],
            UPDATE,
            f"average {self.ctx.trace.layers[layer].name}",
            it,
            layer,
            -1,
        )

    def _pack_op(self, layer: int, it: int) -> tuple[Any, ...]:
        """The op that copies ``layer``'s weights and state into its message of
        iteration ``it`` (exchanging weights)."""
        return (
            self.pack_s[layer],
            UPDATE,
            f"pack {self.ctx.trace.layers[layer].name}",
            it,
            layer,
            -1,
        )

    def _update_op(self, layer: int, it: int) -> tuple[Any, ...]:
        ops = self._updates.setdefault(it, {})
        op = ops.get(layer)
        if op is None:
            name = self.ctx.trace.layers[layer].name
            op = ops[layer] = (
                self.update_s[layer],
                UPDATE,
                f"update {name}" if self.by_weights else f"average+update {name}",
                it,
                layer,
                -1,
            )
        return op

    def _wait_for(self, r: int, it: int, slot: int, gpu: Gpu) -> Any:
        """Wait (a SimPy sub-process) until what rank ``r`` needs from iteration ``it``'s
        exchange in ``slot`` has arrived, or until the GPU is free anyway."""
        env = self.ctx.env
        arr = self.arrival.get((r, it))
        t = arr[slot] if arr is not None else -1.0
        if t < 0:
            ev = self.waiting[(r, it, slot)] = env.event()
            yield ev
        elif t > env.now and t > gpu.busy_until:
            yield env.timeout(t - env.now)

    # ---- exchange -----------------------------------------------------------------------
    def _use(self, r: int, it: int, slot: int) -> None:
        """Rank ``r`` has posted its receive for iteration ``it + 1``'s message in
        ``slot`` (exchanging weights, every slot's once it has mixed in all of ``it``;
        else as it uses ``it``'s message in that slot), so a send held for it goes."""
        key = (r, it, slot)
        held = self.held.pop(key, None)
        if held is None:
            self.used.add(key)
        else:
            self._move(*held)

    def _send(self, r: int, it: int, slot: int) -> None:
        """Rank ``r`` sends its ``slot`` of iteration ``it`` to its partner, once the
        partner has a receive posted for it: receives are posted one iteration ahead
        (realrun.schemes.gossip; :meth:`_use`). gloo moves a message only after the
        receiver's notice; a partner that is behind holds the send."""
        if it > 0:
            key = (self.partners_of(it)[0][r], it - 1, slot)
            if key not in self.used:
                self.held[key] = (r, it, slot)
                return
            self.used.discard(key)  # one sender per receiver and slot: not needed again
        # the next batch (and, exchanging weights, the model) is handed to gloo by the
        # rank's thread between two spans; gradients from inside the backward, whose
        # measured spans hold that time
        self._move(r, it, slot, slot == self.shuffle_slot or self.by_weights)

    def _move(self, r: int, it: int, slot: int, on_thread: bool = False) -> None:
        """Send rank ``r``'s ``slot`` of iteration ``it``: ``on_thread``, written by the
        rank's own thread (a posted receive, and a send between compute spans); else by
        a communication thread (gloo's, for a send held until the partner posted)."""
        ctx = self.ctx
        dst = self.partners_of(it)[0][r]
        if slot == self.shuffle_slot:
            nbytes, tag = self.shuffle_bytes, "shuffle"
        else:
            layer = self.grads[slot]
            nbytes = self.copies * ctx.trace.layers[layer].param_bytes
            tag = f"gossip L{layer}"
        src_dev, dst_dev = ctx.topology.gpus[r], ctx.topology.gpus[dst]
        if self.post is not None:
            msg = self.post(src_dev, dst_dev, nbytes, tag, r, dst, it)
            self._deliver(dst, it, slot, msg.end_s)
        else:
            # receives posted ahead, sends with isend (realrun.p2p): no sender thread
            tr = ctx.transport
            send = tr.isend_on_thread if on_thread else tr.isend
            send(
                src_dev,
                dst_dev,
                nbytes,
                self._arrived,
                tag=tag,
                rank_src=r,
                rank_dst=dst,
                iteration=it,
                payload=(dst, it, slot),
            )

    def _arrived(self, msg: Message) -> None:
        dst, it, slot = msg.payload
        self._deliver(dst, it, slot, self.ctx.env.now)

    def _deliver(self, r: int, it: int, slot: int, t: float) -> None:
        """Rank ``r``'s ``slot`` of iteration ``it`` arrives at time ``t`` (now or, when
        the network knows it in advance, later)."""
        env = self.ctx.env
        arr = self.arrival.get((r, it))
        if arr is None:
            arr = self.arrival[(r, it)] = [-1.0] * (len(self.grads) + 1)
        arr[slot] = t
        ev = self.waiting.pop((r, it, slot), None)
        if ev is not None:
            if t <= env.now:
                ev.succeed()
            else:
                env.timeout(t - env.now).callbacks.append(lambda _e: ev.succeed())
        if slot != self.shuffle_slot:
            self.left[(r, it)] -= 1
            self._maybe_done(r, it)

    def _maybe_done(self, r: int, it: int) -> None:
        bwd = self.bwd_end.get((r, it))
        if bwd is None or self.left[(r, it)] > 0:
            return
        arr = self.arrival.get((r, it))
        end = max([bwd] + (arr[: self.shuffle_slot] if arr else []))
        ctx = self.ctx
        ctx.iteration_end[it][r] = end
        if it == ctx.iterations - 1 and end > ctx.env.now:
            ctx.env.timeout(end - ctx.env.now)  # let the clock reach the last arrival

    def extra_metrics(self) -> dict[str, Any]:
        per_iteration = (
            self.copies * sum(self.ctx.trace.layers[i].param_bytes for i in self.grads)
            + self.shuffle_bytes
            if self.p > 1
            else 0
        )
        return {
            "exchange": self.options.exchange,
            "schedule": self.options.schedule,
            "rotation": self.options.rotation,
            "exchange_bytes": per_iteration,
            "mean_field": self.mirror is not None,
            "simulated_workers": self.simulated,
        }


def _never(_layer: int) -> bool:
    return False


def exchanged_copies(optimizer: str, exchange: str) -> int:
    """Weight-sized arrays in a partner's message: the gradient (``gradients``), the
    gradient and the weights (``gradients+weights``), or the weights and the optimizer's
    state (``weights``: two with SGD momentum, three with Adam, one with plain SGD)."""
    if exchange == "gradients":
        return 1
    if exchange == "gradients+weights":
        return 2
    if exchange == "weights":
        return 1 + OPTIMIZERS[optimizer][0]
    raise ValueError(f"unknown exchange {exchange!r}; choose one of {', '.join(EXCHANGES)}")


def average_passes(optimizer: str, exchange: str) -> int:
    """Weight-sized memory passes to average a partner's message in (read both, write
    one, per array of :func:`exchanged_copies`)."""
    return AVERAGE_PASSES * exchanged_copies(optimizer, exchange)


MIRROR_MIN_MACHINES = 4
"""``mean_field=auto`` mirrors from this many machines on (below, the full model is as
cheap)."""


def xor_masks(p: int, iterations: int, schedule: str, rotation: str) -> list[int] | None:
    """Per iteration, the ``m`` with every rank's partner ``r XOR m``, or ``None`` if some
    iteration's partners are not such a translation (``dissemination``, ``shift``)."""
    masks = []
    for it in range(iterations):
        send, recv = partners(p, it, schedule, rotation)
        m = send[0]
        if any(q != r ^ m for r, q in enumerate(send)) or send != recv:
            return None
        masks.append(m)
    return masks


def mirror_plan(
    config: SimConfig, options: Any, topology: Topology
) -> tuple[int, int, list[tuple[int, int]]] | str:
    """``(GPUs per machine, machines, twin links)`` if the mean field applies, else why
    not. It is exact where every iteration pairs rank ``r`` with ``r XOR m`` (the
    hypercube with the ``singer`` rotation, a linear map over GF(2), or none), the
    machines are alike, full, a power of two in size and numbered in order, and joined by
    one switch: then ``r -> r XOR k`` (``k`` a multiple of the machine size) maps the
    cluster, its traffic and its timeline onto themselves, every machine behaves like
    machine 0 or 1, and a partner on machine ``b XOR m`` can be played by the other
    simulated machine."""
    if config.fidelity != "analytic":
        return "it is a model of the analytic fidelity"
    if config.compute_jitter > 0:
        return "compute jitter breaks the symmetry between workers"
    p = topology.num_gpus
    boxes = topology.ranks_by_box()
    g = len(boxes[0])
    if len(boxes) < 2 or not is_power_of_two(g):
        return "it needs at least two machines with a power-of-two number of GPUs"
    if any(b != list(range(i * g, (i + 1) * g)) for i, b in enumerate(boxes)):
        return "it needs every machine full, ranks numbered machine by machine"
    if xor_masks(p, config.total_iterations, options.schedule, options.rotation) is None:
        return "partners are not rank XOR a constant (use schedule=hypercube, rotation=singer)"
    devs = topology.devices
    if any(devs[link.src].box < 0 and devs[link.dst].box < 0 for link in topology.links):
        return "it needs the machines on one switch"
    twins = topology.box_twins(lambda b: b % 2)
    if twins is None:
        return "the machines are not built alike"
    return g, len(boxes), twins
