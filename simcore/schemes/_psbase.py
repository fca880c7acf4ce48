"""The parameter-server machinery shared by ``ps`` and ``p3``.

Workers push each layer's gradient, cut into *shards* (each on one server), as soon as
backward produces it. A server adds each push into its buffer on its own stream (at
``server_bandwidth``), and once every worker's push of a shard is in, applies the update
and sends the new values back. The next iteration's forward of a layer waits until all
of its shards are back on that worker.

Two protocols:

* *push, then pull* (MXNet's KVStore, the ``ps`` baseline): the server acknowledges each
  push with a small control message; on the acknowledgement the worker sends a pull
  request; the server answers the request with the values once the update is done.
* *fused* (P3): the server answers each push with the updated values; no control
  messages.

Servers run on host CPUs (``colocated``: one per machine by default, on the machines'
hosts) or on dedicated hosts attached to the fabric (``dedicated``).

**Mean-field model** (``mean_field`` where a scheme offers it; analytic fidelity on a
cluster of identical machines with one co-located server each, see
:func:`mean_field_plan` and :func:`use_mean_field`). Every worker pushes every
shard, so the full model sends ``2 * workers * shards`` messages per iteration, about 1.2
million for ResNet-50's P3 slices on 1024 GPUs. When the workers run in lockstep and every
server keeps ``1/machines`` of every shard (instead of whole shards dealt round-robin),
all machines carry the same traffic, and two of them stand for all: machine ``a``'s
workers push each shard as a ``1/machines`` part to their own server and the rest to the
server of machine ``1 - a``, which therefore sees exactly the bytes a real server's NIC
and PCIe links see from all remote workers (and sends the same back). The other machines'
workers follow their twin on machine 0 or 1: they compute the same ops and wait for the
twin's values; their links get the twin's byte counters and the payload totals are scaled
by ``machines / 2``. Messages per iteration no longer grow with the cluster.

What the mean field leaves out is the imbalance of whole shards: which server keeps the
urgent first layers, bursts of pushes of one slice onto one server. Where the full model
keeps a steady period the two agree within 1%; when bandwidth is the bottleneck the full
model can swing between slow and fast iterations; the mean field does not swing and gives
the fast ones, 11-28% below the full model's mean in ``bench/p3_mean_field.py``.

**Placed mean field** (``ps``, whose hash placement of whole arrays is uneven by design:
that imbalance is the cost P3 removes, so it must stay; see
:meth:`ParameterServerScheme._plan_mean_field_placed`). Machines 0 and 1 are simulated
and mirrored as above, but every server keeps the shards the real placement gives it.
An array split over every server is balanced and folded as above. A whole shard keeps
its concentration on its server: its remote pushes (and the acknowledgements, requests
and values that answer them) are *groups* of identical messages
(:meth:`~simcore.network.AnalyticNetwork.send_grouped`) that carry the bytes of all
remote workers on the server's side of the route; for a server on neither simulated
machine, both simulated machines carry half of them over private *shadow* copies of the
server machine's links (:class:`~simcore.network.ShadowLink`), which also wait for the
twin machine's traffic (what the mirrored workers of that machine send and receive),
and the server's work waits for its twin server's. What is exact: the bytes every server
receives and sends and the work it does, the payload totals, and everything where
compute hides communication. What is not: a group's members arrive together (the full
model's workers, each waiting only for its own values, can drift apart around one hot
server), and an array's parts are folded (the full model sends them to the servers in
one order, a hot spot moving from server to server): ``bench/mean_field_accuracy.py``
measures both against the full model.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from simpy import Event

from simcore.clock import EventQueue, FastEvent
from simcore.config import ConfigError, SimConfig, option
from simcore.host import CpuStream
from simcore.network import Message, ShadowLink
from simcore.schemes._ops import LayerOps
from simcore.schemes.base import Scheme
from simcore.topology import Topology
from simcore.work import Workload

PLACEMENTS = ("colocated", "dedicated")
MEAN_FIELD = ("auto", "on", "off")
"""``auto``: the mean-field model in the analytic fidelity where the cluster allows it
and it saves work; ``on``: wherever the cluster allows it; ``off``: every worker and
server, always (see module docs and :func:`use_mean_field`)."""


@dataclass(frozen=True)
class Shard:
    """A piece of a layer's parameters kept by one server.

    Attributes:
        layer: trace layer index.
        server: server number (``0 .. S-1``).
        nbytes: bytes of the piece.
        priority: queueing priority of its messages (lower goes first).
    """

    layer: int
    server: int
    nbytes: int
    priority: float = 0.0


@dataclass(frozen=True)
class ServerOptions:
    """Options every parameter-server scheme has."""

    placement: str = option(
        "colocated",
        "where servers run: on the workers' hosts or on dedicated hosts on the fabric",
        choices=PLACEMENTS,
    )
    servers: int = option(
        0,
        "number of servers (0: one per machine when colocated, one per worker when dedicated)",
        minimum=0,
    )
    server_bandwidth: float = option(
        20e9, "memory bandwidth at which a server adds pushes and applies updates", unit="rate"
    )


def server_count(options: Any, topology: Topology) -> int:
    """The number of servers for ``options`` on ``topology``."""
    if options.servers:
        return options.servers
    if options.placement == "dedicated":
        return len(topology.servers)
    return max(1, len(topology.hosts))


@dataclass(frozen=True)
class MeanField:
    """How a mean-field run maps the cluster onto the two machines it simulates.

    Attributes:
        per_box: GPUs (workers) per machine.
        boxes: machines in the cluster (one server each).
        twins: ``(link, twin link)`` for every link of the machines not simulated, the
            twin being the same link of the simulated machine they mirror.
    """

    per_box: int
    boxes: int
    twins: list[tuple[int, int]]


MEAN_FIELD_MIN_MACHINES = 5
"""``mean_field=auto`` uses the mean field from this many machines on: it sends about
``8 x GPUs per machine x shards`` messages per iteration against ``2 x GPUs x shards``
for the full model, so below five machines the full model is cheaper (and exact)."""


def mean_field_plan(config: SimConfig, options: Any, topology: Topology) -> MeanField | str:
    """The :class:`MeanField` mapping if the mean-field model can run (see module docs),
    else why not: analytic fidelity, no compute jitter, slices dealt by one global
    round-robin counter (if the scheme has the option), servers co-located one per
    machine, at least two machines, all built alike with the same number of GPUs, ranks
    numbered machine by machine, the machines' NICs on one switch."""
    if config.fidelity != "analytic":
        return "it is a model of the analytic fidelity"
    if config.compute_jitter > 0:
        return "compute jitter breaks the workers' lockstep"
    if getattr(options, "round_robin", "global") != "global":
        return "per-key placement is uneven by design; the mean field would balance it"
    if options.placement != "colocated":
        return "it needs servers co-located on the machines"
    boxes = topology.ranks_by_box()
    nboxes = len(boxes)
    if nboxes < 2:
        return "it needs at least two machines"
    if server_count(options, topology) != nboxes:
        return "it needs one server per machine"
    per_box = len(boxes[0])
    if any(b != list(range(i * per_box, (i + 1) * per_box)) for i, b in enumerate(boxes)):
        return "it needs every machine full, ranks numbered machine by machine"
    devs = topology.devices
    if len(topology.hosts) != nboxes or any(
        devs[h].box != devs[topology.gpus[b[0]]].box
        for h, b in zip(topology.hosts, boxes, strict=True)
    ):
        return "it needs one host per machine"
    if any(devs[link.src].box < 0 and devs[link.dst].box < 0 for link in topology.links):
        return "it needs the machines on one switch"
    twins = topology.box_twins(lambda b: b % 2)
    if twins is None:
        return "the machines are not built alike"
    return MeanField(per_box, nboxes, twins)


def use_mean_field(config: SimConfig, options: Any, topology: Topology) -> MeanField | None:
    """The mean-field mapping if ``options.mean_field`` asks for it and it can run:
    ``on`` wherever it can (:class:`ConfigError` saying why not elsewhere), ``auto``
    from :data:`MEAN_FIELD_MIN_MACHINES` machines on, ``off`` (or a scheme without the
    option) never."""
    mode = getattr(options, "mean_field", "off")
    if mode == "off":
        return None
    if topology.host_spec is not None:
        if mode == "on":
            raise ConfigError(
                "scheme.mean_field", "on", "CPU hosts share cores: every worker is simulated"
            )
        return None
    plan = mean_field_plan(config, options, topology)
    if isinstance(plan, str):
        if mode == "on":
            raise ConfigError("scheme.mean_field", "on", plan)
        return None
    if mode == "auto" and plan.boxes < MEAN_FIELD_MIN_MACHINES:
        return None
    return plan


class ParameterServerScheme(Scheme):
    """Base of ``ps`` and ``p3``: subclasses choose the shards and the protocol."""

    fused: ClassVar[bool] = False
    keeps_placement: ClassVar[bool] = False
    """Whether the mean field keeps every server's real shards (``ps``: its hash placement
    is uneven by design) instead of balancing them (``p3``)."""
    control_bytes: ClassVar[int] = 64
    """Size of an acknowledgement or pull request (push-then-pull protocol)."""
    parameter_servers = True
    same_numerics = True

    @classmethod
    def dedicated_servers(cls, options: Any, gpus: int) -> int:
        if options.placement != "dedicated":
            return 0
        return options.servers or gpus

    @classmethod
    def server_ranks(cls, options: Any, workers: int) -> int:
        """The option's servers, or one per worker (a real run's worker is a machine)."""
        return int(options.servers) or workers

    @classmethod
    def estimated_mean_field(cls, work: Workload) -> bool:
        """Whether the run would use the mean-field model (a close approximation of
        :func:`use_mean_field` that needs no topology)."""
        config, options = work.config, work.options
        mode = options.mean_field
        if mode == "off" or config.fidelity != "analytic" or config.compute_jitter > 0:
            return False
        if work.cpu_hosts:  # as use_mean_field: CPU hosts simulate every worker
            return False
        if options.placement != "colocated" or options.servers:
            return False
        if getattr(options, "round_robin", "global") != "global":
            return False
        p, g = work.gpus, work.per_box
        return p % g == 0 and p // g >= (2 if mode == "on" else MEAN_FIELD_MIN_MACHINES)

    @classmethod
    def check(cls, config: SimConfig, options: Any, topology: Topology) -> None:
        if options.placement == "colocated" and not topology.hosts:
            raise ConfigError(
                "scheme.placement",
                "colocated",
                f"topology {topology.name!r} has no host CPUs; use dedicated",
            )
        use_mean_field(config, options, topology)

    @abstractmethod
    def make_shards(self, num_servers: int) -> list[Shard]:
        """The shards of every layer with parameters, over ``num_servers`` servers."""

    # ---- set-up ----------------------------------------------------------------------
    def start(self) -> None:
        ctx = self.ctx
        topo = ctx.topology
        trace = ctx.trace
        self.S = server_count(self.options, topo)
        self.p = ctx.num_ranks
        self.shards = self.make_shards(self.S)
        self.layer_shards: dict[int, list[int]] = {}
        for k, sh in enumerate(self.shards):
            self.layer_shards.setdefault(sh.layer, []).append(k)
        self.real_shards = len(self.shards)
        self.mean_field = use_mean_field(ctx.config, self.options, topo)
        self.group_mult: dict[tuple[int, int, int], float] | None = None
        self.server_twin: list[int] = []
        if self.mean_field is None:
            self._plan_every_worker(topo)
        elif self.keeps_placement:
            self._plan_mean_field_placed(self.mean_field, topo)
            self.layer_shards = {}
            for k, sh in enumerate(self.shards):
                self.layer_shards.setdefault(sh.layer, []).append(k)
        else:
            self._plan_mean_field(self.mean_field, topo)
        if not self.server_twin:
            self.server_twin = list(range(len(self.server_dev)))
        self.server_name = [f"{topo.devices[d].name}/ps{s}" for s, d in enumerate(self.server_dev)]
        self.server_busy = [0.0] * len(self.server_dev)
        self.server_streams: list[CpuStream] | None = None
        host = topo.host_spec
        if host is not None and ctx.cpu_pool_of is not None:
            # CPU hosts: a server is a thread on its machine's shared cores; it adds
            # pushes at the host's reduction cost and updates a shard as an optimizer
            # step: the device's fixed step overhead plus passes at its memory bandwidth
            # (a real server's per-shard work, its aggregation's and step's calls, is
            # most of what it costs: ~0.4-2 ms a shard, 2026-11-24).
            self.server_streams = [
                CpuStream(ctx.cpu_pool_of(d), self._server_logger(s))
                for s, d in enumerate(self.server_dev)
            ]
            self.add_s_per_byte = host.reduce_cpu_s_per_byte
            self.update_s_per_byte = 1.0 / topo.gpu_spec.memory_bandwidth_bytes_per_s
            self.step_overhead_s = topo.gpu_spec.step_overhead_s
        else:
            self.add_s_per_byte = self.update_s_per_byte = 1.0 / self.options.server_bandwidth
            self.step_overhead_s = 0.0
        # Server s's pushes of shard k per iteration: expected[k][s].
        self.expected: list[dict[int, int]] = []
        for parts in self.parts:
            exp: dict[int, int] = {}
            for c, plist in enumerate(parts):
                for s, _nb in plist:
                    exp[s] = exp.get(s, 0) + len(self.class_ranks[c])
            self.expected.append(exp)
        n_it = ctx.iterations
        self.ops = LayerOps(trace)
        self.follower_ops = LayerOps(trace)
        # Per pushing worker: the last iteration whose values have come back, per layer.
        self.avail = [dict.fromkeys(self.layer_shards, -1) for _ in range(self.p)]
        self.left: dict[tuple[int, int, int], int] = {}  # (rank, it, layer) -> parts
        # The tags of a layer's pushes and values, built once rather than per message.
        self._push_tags = {layer: f"push L{layer}" for layer in self.layer_shards}
        self._pull_tags = {layer: f"pull L{layer}" for layer in self.layer_shards}
        self.layers_left = [[len(self.layer_shards)] * n_it for _ in range(self.p)]
        self.bwd_done = [[False] * n_it for _ in range(self.p)]
        self.waiting: dict[tuple[int, int], list[tuple[int, Event]]] = {}
        # Per (shard, server, iteration): pushes added, value ready, pending pulls.
        self.added: dict[tuple[int, int, int], int] = {}
        # CPU hosts: pushes of a shard arrived so far, and the receiving threads that
        # went on to update the shard (a real server updates on the thread that took
        # the last push), to release once the update is done
        self.arrived: dict[tuple[int, int, int], int] = {}
        self.updating: dict[tuple[int, int, int], Callable[[], None]] = {}
        self.ready: set[tuple[int, int, int]] = set()
        self.pulls: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self.env = ctx.env
        self._at = EventQueue(ctx.env).at
        self.record_spans = ctx.config.record_spans
        pb = trace.param_bytes
        self.update_passes = ctx.update_passes
        for r in range(self.p):
            mem = ctx.gpus[r].memory
            mem.alloc("weights", pb)
            mem.alloc("gradients", pb)
            ctx.env.process(self._worker(r))

    def _plan_every_worker(self, topo: Topology) -> None:
        """Every worker pushes every shard whole to the server that keeps it."""
        if self.options.placement == "dedicated":
            devs = topo.servers
            self.server_dev = [devs[s % len(devs)] for s in range(self.S)]
        else:
            self.server_dev = [topo.hosts[s % len(topo.hosts)] for s in range(self.S)]
        self.leader = list(range(self.p))
        self.rank_class = [0] * self.p
        self.class_ranks = [list(range(self.p))]
        self.parts = [(((sh.server, sh.nbytes),),) for sh in self.shards]
        self.share = [float(sh.nbytes) for sh in self.shards]

    def _plan_mean_field(self, mf: MeanField, topo: Topology) -> None:
        """Machines 0 and 1 simulated, each server holding ``1/boxes`` of every shard; a
        worker's push of a shard is a part for its own machine's server and the rest for
        the other machine's (both parts empty-free); everyone else follows its twin."""
        g, h = mf.per_box, mf.boxes
        self.server_dev = [topo.hosts[0], topo.hosts[1]]
        self.leader = [(r // g % 2) * g + r % g for r in range(self.p)]
        self.rank_class = [r // g if r < 2 * g else -1 for r in range(self.p)]
        self.class_ranks = [list(range(g)), list(range(g, 2 * g))]
        self.parts = []
        for sh in self.shards:
            local = round(sh.nbytes / h)
            remote = sh.nbytes - local
            self.parts.append(
                tuple(
                    tuple((s, nb) for s, nb in ((c, local), (1 - c, remote)) if nb > 0)
                    for c in (0, 1)
                )
            )
        self.share = [sh.nbytes / h for sh in self.shards]
        self.ctx.traffic_scale = h / 2

    def _plan_mean_field_placed(self, mf: MeanField, topo: Topology) -> None:
        """The mean field of a scheme whose placement is uneven (``ps``): machines 0 and 1
        simulated and mirrored as in :meth:`_plan_mean_field`, but every server kept with
        the shards the real placement gives it (see module docs, *placed mean field*).

        An array split evenly over every server is folded as in the balanced mean field
        (its own machine's part to the local server, the rest to the twin's). A whole
        shard on server ``s`` keeps its concentration: on machine 0 or 1, the other
        machine's workers push it as *groups* of ``machines - 1`` identical messages (all
        remote workers) on the server's side of the route; on any other machine, each
        simulated machine's workers carry half of the remote pushes, ``(machines - 1)/2``
        on the server machine's network links and ``machines/2`` (its own workers' pushes
        included) on the last hop into the server, over private *shadow* copies of that
        machine's links that also wait for the twin machine's traffic (the mirrored
        workers' traffic they share). Servers on other machines likewise queue their work
        behind their twin server's."""
        g, h = mf.per_box, mf.boxes
        self.server_dev = list(topo.hosts[:h])
        self.server_twin = [s if s < 2 else s % 2 for s in range(h)]
        self.leader = [(r // g % 2) * g + r % g for r in range(self.p)]
        self.rank_class = [r // g if r < 2 * g else -1 for r in range(self.p)]
        self.class_ranks = [list(range(g)), list(range(g, 2 * g))]
        by_layer: dict[int, list[Shard]] = {}
        for sh in self.shards:
            by_layer.setdefault(sh.layer, []).append(sh)
        shards: list[Shard] = []
        parts: list[tuple[tuple[tuple[int, int], ...], ...]] = []
        share: list[float] = []
        mult: dict[tuple[int, int, int], float] = {}
        for layer, shs in by_layer.items():
            on = {sh.server: sh.nbytes for sh in shs}
            if len(shs) == h and len(on) == h:  # split over every server: balanced
                total = sum(on.values())
                k = len(shards)
                shards.append(Shard(layer, 0, total, shs[0].priority))
                parts.append(
                    tuple(
                        tuple((sv, nb) for sv, nb in ((c, on[c]), (1 - c, total - on[c])) if nb > 0)
                        for c in (0, 1)
                    )
                )
                share.append(total / h)
                continue
            for sh in shs:
                k = len(shards)
                shards.append(sh)
                parts.append((((sh.server, sh.nbytes),),) * 2)
                share.append(float(sh.nbytes))
                for c in (0, 1):
                    if sh.server >= 2:
                        mult[(k, c, sh.server)] = h / 2
                    elif sh.server != c:
                        mult[(k, c, sh.server)] = h - 1.0
        # Real payload per iteration over what the simulated messages carry.
        control = 0 if self.fused else 2 * self.control_bytes
        real = self.p * sum(2 * sh.nbytes + control for sh in self.shards)
        simulated = sum(
            g * (2 * nb + control) for plist in parts for cparts in plist for _s, nb in cparts
        )
        self.shards, self.parts, self.share = shards, parts, share
        self.group_mult = mult
        self._routes: dict[tuple[int, int, int, bool], tuple[Any, tuple[float, ...]]] = {}
        self._shadows: dict[int, ShadowLink] = {}
        self._twin_link = dict(mf.twins)
        self.ctx.traffic_scale = real / simulated if simulated else 1.0

    def _grouped_route(
        self, src: int, dst: int, s: int, w: float, to_server: bool
    ) -> tuple[Any, tuple[float, ...]]:
        """Hops and per-hop weights of a grouped message between a simulated worker's
        GPU and server ``s``: ``w`` on the server machine's links (``machines / 2`` on
        the last one into or out of a server not simulated in full, whose links are
        shadows), 1 on the worker's side."""
        key = (src, dst, s, to_server)
        hit = self._routes.get(key)
        if hit is not None:
            return hit
        net = self.ctx.net
        devs = self.ctx.topology.devices
        box = devs[self.server_dev[s]].box
        host = self.server_dev[s]
        h = self.mean_field.boxes
        hops, weights = [], []
        for st in net.hops(src, dst):
            link = st.link
            if max(devs[link.src].box, devs[link.dst].box) != box:
                hops.append(st)
                weights.append(1.0)
                continue
            if s >= 2:
                sh = self._shadows.get(link.index)
                if sh is None:
                    sh = self._shadows[link.index] = ShadowLink(
                        link, net.state[self._twin_link[link.index]]
                    )
                hops.append(sh)
                weights.append(h / 2 if host in (link.src, link.dst) else (h - 1) / 2)
            else:
                hops.append(st)
                weights.append(w)
        hit = self._routes[key] = (tuple(hops), tuple(weights))
        return hit

    def _send(
        self,
        src: int,
        dst: int,
        nbytes: int,
        then: Any,
        k: int,
        s: int,
        r: int,
        to_server: bool,
        **kw: Any,
    ) -> None:
        """Send between rank ``r``'s GPU and server ``s`` for shard ``k``: a plain message,
        or a grouped one in the placed mean field."""
        gm = self.group_mult
        w = gm.get((k, self.rank_class[r], s), 1.0) if gm is not None else 1.0
        transport = self.ctx.transport
        if w == 1.0:
            transport.send(src, dst, nbytes, then, priority=self.shards[k].priority, **kw)
            return
        hops, weights = self._grouped_route(src, dst, s, w, to_server)
        transport.send_grouped(src, dst, nbytes, hops, weights, then, **kw)

    def finish(self) -> None:
        if self.mean_field is not None:
            self.ctx.net.copy_counters(self.mean_field.twins)

    # ---- worker ----------------------------------------------------------------------
    def _worker(self, r: int) -> Any:
        """Rank ``r``'s iterations. A follower (mean-field model) computes like its leader
        and waits for the leader's values instead of pushing its own."""
        ctx = self.ctx
        gpu = ctx.gpus[r]
        mem = gpu.memory
        act = ctx.trace.activation_bytes
        q = self.leader[r]
        avail = self.avail[q]
        has_shards = self.layer_shards.__contains__
        for it in range(ctx.iterations):
            # Forward: a layer with parameters waits for its values of the last iteration.
            for layer, run in self.ops.forward_runs(it, has_shards):
                if layer >= 0 and avail[layer] < it - 1:
                    ev = ctx.env.event()
                    self.waiting.setdefault((q, layer), []).append((it - 1, ev))
                    yield ev
                gpu.enqueue(run)
            mem.alloc("activations", act)
            if q == r:
                # Backward: each layer's gradient is pushed as soon as it is computed.
                for layer, run in self.ops.backward_runs(it, has_shards):
                    yield gpu.compute_seq(run)
                    if layer >= 0:
                        self._push(r, it, layer)
            else:
                for _layer, run in self.follower_ops.backward_runs(it, _never):
                    yield gpu.compute_seq(run)
            mem.free("activations", act)
            self.bwd_done[r][it] = True
            self._maybe_done(r, it)

    def _push(self, r: int, it: int, layer: int) -> None:
        send = self.ctx.transport.send
        src = self.ctx.topology.gpus[r]
        c = self.rank_class[r]
        tag = self._push_tags[layer]
        arrived = self._push_arrived
        n = 0
        for k in self.layer_shards[layer]:
            sh = self.shards[k]
            for s, nb in self.parts[k][c]:
                n += 1
                if self.group_mult is None:
                    # Network.send's arguments by position (on_arrival, priority, tag,
                    # rank_src, rank_dst, iteration, payload): no keyword packing
                    send(
                        src,
                        self.server_dev[s],
                        nb,
                        arrived,
                        sh.priority,
                        tag,
                        r,
                        -1,
                        it,
                        (k, s, r, it),
                    )
                    continue
                self._send(
                    src,
                    self.server_dev[s],
                    nb,
                    self._push_arrived,
                    k,
                    s,
                    r,
                    True,
                    tag=tag,
                    rank_src=r,
                    iteration=it,
                    payload=(k, s, r, it),
                )
        self.left[(r, it, layer)] = n

    def _value_arrived(self, msg: Message) -> None:
        k, _s, r, it = msg.payload
        layer = self.shards[k].layer
        key = (r, it, layer)
        left = self.left[key] - 1
        if left:
            self.left[key] = left
            return
        del self.left[key]
        self.avail[r][layer] = it
        waiters = self.waiting.pop((r, layer), None)
        if waiters:
            later = [w for w in waiters if w[0] > it]
            for w_it, ev in waiters:
                if w_it <= it:
                    ev.succeed()
            if later:
                self.waiting[(r, layer)] = later
        self.layers_left[r][it] -= 1
        if self.layers_left[r][it] == 0:
            for f in self.followers(r):
                self._maybe_done(f, it)

    def followers(self, r: int) -> list[int]:
        """Rank ``r`` and the ranks that follow it (mean-field model)."""
        if self.mean_field is None:
            return [r]
        return list(range(r, self.p, 2 * self.mean_field.per_box))

    def _maybe_done(self, r: int, it: int) -> None:
        if self.bwd_done[r][it] and self.layers_left[self.leader[r]][it] == 0:
            self.ctx.mark_iteration(r, it)

    # ---- server ----------------------------------------------------------------------
    def _server_logger(self, s: int) -> Any:
        def log(start: float, end: float, info: tuple[str, int]) -> None:
            if self.ctx.config.record_spans:
                kind, it = info
                self.ctx.compute_log.append(
                    (self.server_name[s], kind, kind, start, end, it, -1, -1)
                )

        return log

    def _server_time(self, s: int, seconds: float, kind: str, it: int) -> float:
        """Queue ``seconds`` of work on server ``s``'s stream; returns when it ends (on
        CPU hosts, where that is not known yet, ``nan``)."""
        if self.server_streams is not None:
            self.server_streams[s].submit(seconds, (kind, it))
            return math.nan
        busy = self.server_busy
        start = self.env.now
        if busy[s] > start:
            start = busy[s]
        twin = busy[self.server_twin[s]]
        if twin > start:
            start = twin
        end = start + seconds
        busy[s] = end
        if self.record_spans:
            self.ctx.compute_log.append((self.server_name[s], kind, kind, start, end, it, -1, -1))
        return end

    def _server_work(self, s: int, seconds: float, kind: str, it: int, then: Any, arg: Any) -> None:
        if self.server_streams is not None:
            done = _Finished(arg)
            self.server_streams[s].submit(seconds, (kind, it), lambda _end: then(done))
            return
        # What env.timeout(end - now, arg) schedules (the same time and order), as a
        # lighter event.
        now = self.env.now
        self._at(now + (self._server_time(s, seconds, kind, it) - now), _Finished(arg, [then]))

    def _push_arrived(self, msg: Message) -> None:
        k, s, r, it = msg.payload
        secs = msg.nbytes * self.add_s_per_byte
        if self.group_mult is not None:
            secs *= self.group_mult.get((k, self.rank_class[r], s), 1.0)
        key = (k, s, it)
        if self.server_streams is not None:
            n = self.arrived.get(key, 0) + 1
            if n < self.expected[k][s]:
                self.arrived[key] = n
            else:
                del self.arrived[key]
                msg.hold = lambda release: self.updating.__setitem__(key, release)
        if self.fused:
            # Nothing answers a single push: only the last worker's push of a shard,
            # added last on the server's in-order stream, needs an event.
            n = self.added.get(key, 0) + 1
            if n < self.expected[k][s]:
                self.added[key] = n
                self._server_time(s, secs, "aggregate", it)
                return
            self.added.pop(key, None)
            self._server_work(s, secs, "aggregate", it, self._all_added, key)
            return
        self._server_work(s, secs, "aggregate", it, self._added, (k, s, r, it, msg.nbytes))

    def _added(self, ev: Any) -> None:
        k, s, r, it, nb = ev._value
        self._send(
            self.server_dev[s],
            self.ctx.topology.gpus[r],
            self.control_bytes,
            self._acked,
            k,
            s,
            r,
            False,
            tag="ack",
            rank_dst=r,
            iteration=it,
            payload=(k, s, r, it, nb),
        )
        key = (k, s, it)
        self.added[key] = self.added.get(key, 0) + 1
        if self.added[key] == self.expected[k][s]:
            del self.added[key]
            self._update(key)

    def _all_added(self, ev: Any) -> None:
        self._update(ev._value)

    def _update(self, key: tuple[int, int, int]) -> None:
        k, s, it = key
        secs = self.update_passes * self.share[k] * self.update_s_per_byte + self.step_overhead_s
        self._server_work(s, secs, "update", it, self._updated, key)

    def _updated(self, ev: Any) -> None:
        key = ev._value
        k, s, it = key
        release = self.updating.pop(key, None)
        if release is not None:
            release()
        if self.fused:
            for c, plist in enumerate(self.parts[k]):
                for s2, nb in plist:
                    if s2 == s:
                        self._send_values(k, s, it, nb, self.class_ranks[c])
            return
        self.ready.add(key)
        for r, nb in self.pulls.pop(key, []):
            self._send_values(k, s, it, nb, (r,))

    def _acked(self, msg: Message) -> None:
        k, s, r, it, _nb = msg.payload
        self._send(
            self.ctx.topology.gpus[r],
            self.server_dev[s],
            self.control_bytes,
            self._pull_arrived,
            k,
            s,
            r,
            True,
            tag="pull request",
            rank_src=r,
            iteration=it,
            payload=msg.payload,
        )

    def _pull_arrived(self, msg: Message) -> None:
        k, s, r, it, nb = msg.payload
        if (k, s, it) in self.ready:
            self._send_values(k, s, it, nb, (r,))
        else:
            self.pulls.setdefault((k, s, it), []).append((r, nb))

    def _send_values(self, k: int, s: int, it: int, nbytes: int, ranks: Sequence[int]) -> None:
        """Send server ``s``'s values of shard ``k`` (``nbytes`` each) to every rank of
        ``ranks``, in order."""
        if self.group_mult is not None:
            for r in ranks:
                self._send_grouped_value(k, s, r, it, nbytes)
            return
        sh = self.shards[k]
        src, gpus = self.server_dev[s], self.ctx.topology.gpus
        tag = self._pull_tags[sh.layer]
        # Plain messages, sent in one call each as _push sends (what _send would do,
        # without its two calls and its keyword packing: a value per worker and slice),
        # Network.send's arguments by position as in _push
        send, arrived, priority = self.ctx.transport.send, self._value_arrived, sh.priority
        for r in ranks:
            send(src, gpus[r], nbytes, arrived, priority, tag, -1, r, it, (k, s, r, it))

    def _send_grouped_value(self, k: int, s: int, r: int, it: int, nbytes: int) -> None:
        """Send rank ``r``'s values of shard ``k`` from server ``s`` in the placed mean
        field (see :meth:`_send`)."""
        sh = self.shards[k]
        src, dst = self.server_dev[s], self.ctx.topology.gpus[r]
        tag, payload = self._pull_tags[sh.layer], (k, s, r, it)
        self._send(
            src,
            dst,
            nbytes,
            self._value_arrived,
            k,
            s,
            r,
            False,
            tag=tag,
            rank_dst=r,
            iteration=it,
            payload=payload,
        )

    def extra_metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"servers": self.S, "shards": self.real_shards}
        if hasattr(self.options, "mean_field"):
            mf = self.mean_field
            out["mean_field"] = mf is not None
            out["simulated_workers"] = self.p if mf is None else 2 * mf.per_box
        return out


class _Finished(FastEvent):
    """A server's finished work: the event its continuation runs on, handing it
    ``value`` as a SimPy timeout's ``_value`` (see :mod:`simcore.clock`)."""

    __slots__ = ("_value",)

    def __init__(self, value: Any, callbacks: list[Callable[[Any], None]] | None = None) -> None:
        super().__init__(callbacks)
        self._value = value


def _never(_layer: int) -> bool:
    """A follower's backward is one run: it pushes nothing."""
    return False
