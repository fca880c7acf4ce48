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
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from simpy import Event

from simcore.config import ConfigError, SimConfig, option
from simcore.network import Message
from simcore.schemes._ops import LayerOps
from simcore.schemes.base import Scheme
from simcore.topology import Topology

PLACEMENTS = ("colocated", "dedicated")


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

    placement: str = option("colocated", "where servers run: on the workers' hosts or on "
                                         "dedicated hosts on the fabric", choices=PLACEMENTS)
    servers: int = option(0, "number of servers (0: one per machine when colocated, one per "
                             "worker when dedicated)", minimum=0)
    server_bandwidth: float = option(20e9, "memory bandwidth at which a server adds pushes "
                                           "and applies updates", unit="rate")


def server_count(options: Any, topology: Topology) -> int:
    """The number of servers for ``options`` on ``topology``."""
    if options.servers:
        return options.servers
    if options.placement == "dedicated":
        return len(topology.servers)
    return max(1, len(topology.hosts))


class ParameterServerScheme(Scheme):
    """Base of ``ps`` and ``p3``: subclasses choose the shards and the protocol."""

    fused: ClassVar[bool] = False
    control_bytes: ClassVar[int] = 64
    """Size of an acknowledgement or pull request (push-then-pull protocol)."""

    @classmethod
    def dedicated_servers(cls, options: Any, gpus: int) -> int:
        if options.placement != "dedicated":
            return 0
        return options.servers or gpus

    @classmethod
    def check(cls, config: SimConfig, options: Any, topology: Topology) -> None:
        if options.placement == "colocated" and not topology.hosts:
            raise ConfigError("scheme.placement", "colocated",
                              f"topology {topology.name!r} has no host CPUs; use dedicated")

    @abstractmethod
    def make_shards(self, num_servers: int) -> list[Shard]:
        """The shards of every layer with parameters, over ``num_servers`` servers."""

    # ---- set-up ----------------------------------------------------------------------
    def start(self) -> None:
        ctx = self.ctx
        topo = ctx.topology
        trace = ctx.trace
        self.S = server_count(self.options, topo)
        if self.options.placement == "dedicated":
            devs = topo.servers
            self.server_dev = [devs[s % len(devs)] for s in range(self.S)]
        else:
            self.server_dev = [topo.hosts[s % len(topo.hosts)] for s in range(self.S)]
        self.server_name = [f"{topo.devices[d].name}/ps{s}" for s, d in
                            enumerate(self.server_dev)]
        self.server_busy = [0.0] * self.S
        self.shards = self.make_shards(self.S)
        self.layer_shards: dict[int, list[int]] = {}
        for k, sh in enumerate(self.shards):
            self.layer_shards.setdefault(sh.layer, []).append(k)
        self.p = ctx.num_ranks
        n_it = ctx.iterations
        self.ops = LayerOps(trace)
        # Per worker: the last iteration whose values have come back, per layer.
        self.avail = [dict.fromkeys(self.layer_shards, -1) for _ in range(self.p)]
        self.left: dict[tuple[int, int, int], int] = {}      # (rank, it, layer) -> shards
        self.layers_left = [[len(self.layer_shards)] * n_it for _ in range(self.p)]
        self.bwd_done = [[False] * n_it for _ in range(self.p)]
        self.waiting: dict[tuple[int, int], tuple[int, Event]] = {}
        # Per server shard and iteration: pushes added, value ready, pending pulls.
        self.added: dict[tuple[int, int], int] = {}
        self.ready: set[tuple[int, int]] = set()
        self.pulls: dict[tuple[int, int], list[int]] = {}
        pb = trace.param_bytes
        self.update_passes = ctx.update_passes
        for r in range(self.p):
            mem = ctx.gpus[r].memory
            mem.alloc("weights", pb)
            mem.alloc("gradients", pb)
            ctx.env.process(self._worker(r))

    # ---- worker ----------------------------------------------------------------------
    def _worker(self, r: int) -> Any:
        ctx = self.ctx
        gpu = ctx.gpus[r]
        mem = gpu.memory
        act = ctx.trace.activation_bytes
        avail = self.avail[r]
        has_shards = self.layer_shards.__contains__
        for it in range(ctx.iterations):
            # Forward: a layer with parameters waits for its values of the last iteration.
            for layer, run in self.ops.forward_runs(it, has_shards):
                if layer >= 0 and avail[layer] < it - 1:
                    ev = ctx.env.event()
                    self.waiting[(r, layer)] = (it - 1, ev)
                    yield ev
                gpu.enqueue(run)
            mem.alloc("activations", act)
            # Backward: each layer's gradient is pushed as soon as it is computed.
            for layer, run in self.ops.backward_runs(it, has_shards):
                yield gpu.compute_seq(run)
                if layer >= 0:
                    self._push(r, it, layer)
            mem.free("activations", act)
            self.bwd_done[r][it] = True
            self._maybe_done(r, it)

    def _push(self, r: int, it: int, layer: int) -> None:
        net = self.ctx.net
        src = self.ctx.topology.gpus[r]
        self.left[(r, it, layer)] = len(self.layer_shards[layer])
        for k in self.layer_shards[layer]:
            sh = self.shards[k]
            net.send(src, self.server_dev[sh.server], sh.nbytes, self._push_arrived,
                     priority=sh.priority, tag=f"push L{layer}", rank_src=r, iteration=it,
                     payload=(k, r, it))

    def _value_arrived(self, msg: Message) -> None:
        k, r, it = msg.payload
        layer = self.shards[k].layer
        key = (r, it, layer)
        self.left[key] -= 1
        if self.left[key]:
            return
        del self.left[key]
        self.avail[r][layer] = it
        w = self.waiting.get((r, layer))
        if w is not None and w[0] <= it:
            del self.waiting[(r, layer)]
            w[1].succeed()
        self.layers_left[r][it] -= 1
        self._maybe_done(r, it)

    def _maybe_done(self, r: int, it: int) -> None:
        if self.bwd_done[r][it] and self.layers_left[r][it] == 0:
            self.ctx.mark_iteration(r, it)

    # ---- server ----------------------------------------------------------------------
    def _server_time(self, s: int, seconds: float, kind: str, it: int) -> float:
        """Queue ``seconds`` of work on server ``s``'s stream; returns when it ends."""
        start = max(self.ctx.env.now, self.server_busy[s])
        end = start + seconds
        self.server_busy[s] = end
        if self.ctx.config.record_spans:
            self.ctx.compute_log.append((self.server_name[s], kind, kind, start, end, it, -1,
                                         -1))
        return end

    def _server_work(self, s: int, seconds: float, kind: str, it: int, then: Any,
                     arg: Any) -> None:
        env = self.ctx.env
        ev = env.timeout(self._server_time(s, seconds, kind, it) - env.now, arg)
        ev.callbacks.append(then)

    def _push_arrived(self, msg: Message) -> None:
        k, r, it = msg.payload
        sh = self.shards[k]
        secs = sh.nbytes / self.options.server_bandwidth
        if self.fused:
            # Nothing answers a single push: only the last worker's push of a shard,
            # added last on the server's in-order stream, needs an event.
            key = (k, it)
            n = self.added.get(key, 0) + 1
            if n < self.p:
                self.added[key] = n
                self._server_time(sh.server, secs, "aggregate", it)
                return
            self.added.pop(key, None)
            self._server_work(sh.server, secs, "aggregate", it, self._all_added, (k, it))
            return
        self._server_work(sh.server, secs, "aggregate", it, self._added, (k, r, it))

    def _added(self, ev: Any) -> None:
        k, r, it = ev._value
        sh = self.shards[k]
        self.ctx.net.send(self.server_dev[sh.server], self.ctx.topology.gpus[r],
                          self.control_bytes, self._acked, priority=sh.priority,
                          tag="ack", rank_dst=r, iteration=it, payload=(k, r, it))
        key = (k, it)
        self.added[key] = self.added.get(key, 0) + 1
        if self.added[key] == self.p:
            del self.added[key]
            self._update(k, it)

    def _all_added(self, ev: Any) -> None:
        self._update(*ev._value)

    def _update(self, k: int, it: int) -> None:
        sh = self.shards[k]
        secs = self.update_passes * sh.nbytes / self.options.server_bandwidth
        self._server_work(sh.server, secs, "update", it, self._updated, (k, it))

    def _updated(self, ev: Any) -> None:
        k, it = ev._value
        if self.fused:
            for r in range(self.p):
                self._send_value(k, r, it)
            return
        self.ready.add((k, it))
        for r in self.pulls.pop((k, it), []):
            self._send_value(k, r, it)

    def _acked(self, msg: Message) -> None:
        k, r, it = msg.payload
        sh = self.shards[k]
        self.ctx.net.send(self.ctx.topology.gpus[r], self.server_dev[sh.server],
                          self.control_bytes, self._pull_arrived, priority=sh.priority,
                          tag="pull request", rank_src=r, iteration=it, payload=(k, r, it))

    def _pull_arrived(self, msg: Message) -> None:
        k, r, it = msg.payload
        if (k, it) in self.ready:
            self._send_value(k, r, it)
        else:
            self.pulls.setdefault((k, it), []).append(r)

    def _send_value(self, k: int, r: int, it: int) -> None:
        sh = self.shards[k]
        self.ctx.net.send(self.server_dev[sh.server], self.ctx.topology.gpus[r], sh.nbytes,
                          self._value_arrived, priority=sh.priority, tag=f"pull L{sh.layer}",
                          rank_dst=r, iteration=it, payload=(k, r, it))

    def extra_metrics(self) -> dict[str, Any]:
        return {"servers": self.S, "shards": len(self.shards)}
