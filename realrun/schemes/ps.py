"""``ps`` for real: parameter-server ranks with MXNet's key placement and protocol.

Ranks ``workers .. workers+servers-1`` are servers. Keys are the model's layers (a
layer's parameters flattened, see :mod:`realrun.runtime`); their placement is
:func:`simcore.schemes.ps.mxnet_shards` of the model's layers, the call the simulator
makes on the trace: arrays of at least ``big_array_bytes`` split evenly over all servers,
smaller ones whole on the server ``key * 9973 mod S``.

A worker pushes each shard of a layer as soon as backward has produced the layer's
gradients, in the order backward produces them. A server adds the workers' pushes of a
shard (in worker order, so the sum is deterministic), acknowledges each push, and once
all workers' pushes are in applies the optimizer step to the shard (the mean gradient, as
synchronous SGD on the concatenated batches). A worker answers each acknowledgement with
a pull request; the server answers a pull request with the shard's new values once it
has them. The next iteration's forward of a layer waits until all of the layer's shards
are back. Control messages (acknowledgement, pull request) are 64 bytes, the simulator's
``control_bytes``.

``p3`` (:mod:`realrun.schemes.p3`) changes the shards, the order of the send queues and
the protocol (push answered by the values).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from realrun.runtime import (
    ACK,
    KIND_NAMES,
    PULL,
    PUSH,
    STOP,
    VALUE,
    Messenger,
    Slots,
    make_optimizer,
)
from realrun.schemes.base import WorkerLoop
from realrun.worker import RankContext
from simcore.records import COMPUTE, UPDATE
from simcore.schemes._psbase import Shard
from simcore.schemes.ps import mxnet_shards

DTYPE_BYTES = 4
"""The real runs train in float32."""


@dataclass(frozen=True)
class RealShard:
    """A shard with where its elements lie in its layer's flat vector."""

    shard: Shard
    offset: int
    numel: int


class PSRuntime(WorkerLoop):
    """MXNet-style parameter servers (see module docs)."""

    fused = False
    """Whether a push is answered by the values (P3) rather than an acknowledgement."""

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        self.W = self.job.workers
        self.S = self.job.servers
        layer_bytes = [
            (i, pb)
            for i, (_n, pb, kind) in enumerate(self.setup.trace_layers)
            if pb > 0 and kind != "input"
        ]
        shards = self.make_shards(layer_bytes)
        offsets: dict[int, int] = {}
        self.shards: list[RealShard] = []
        for sh in shards:
            off = offsets.get(sh.layer, 0)
            self.shards.append(RealShard(sh, off // DTYPE_BYTES, sh.nbytes // DTYPE_BYTES))
            offsets[sh.layer] = off + sh.nbytes
        self.by_layer: dict[int, list[int]] = {}
        for k, rs in enumerate(self.shards):
            self.by_layer.setdefault(rs.shard.layer, []).append(k)
        ctx.extra["placement"] = [
            [rs.shard.layer, rs.shard.server, rs.shard.nbytes] for rs in self.shards
        ]
        self.slots = Slots()
        self.lock = threading.Lock()
        kind = VALUE if ctx.is_worker else PUSH
        # the payloads a peer sends per iteration, in the order backward pushes them
        order = sorted(range(len(self.shards)), key=lambda k: -self.shards[k].shard.layer)
        self.from_peer: dict[int, list[tuple[int, int]]] = {}
        if ctx.is_worker:
            peers = [self.W + s for s in range(self.S)]
            self.values: dict[tuple[int, int], torch.Tensor] = {}
            self.loaded: set[tuple[int, int]] = set()
            self.left: dict[int, int] = {}
        else:
            peers = list(range(self.W))
            self._server_state()
        for p in peers:
            server = p if ctx.is_worker else ctx.rank
            self.from_peer[p] = [(kind, k) for k in order if self.server_rank(k) == server]
        self.msg = Messenger(
            ctx.rank,
            self.job.world_size,
            peers,
            self.rec,
            ctx.group,
            self.on_message,
            self.buffer_for,
            self.label,
            expected=self.expected,
            window=2 * max((len(ks) for ks in self.from_peer.values()), default=0),
        )

    # ---- layout (p3 overrides) -------------------------------------------------------
    def make_shards(self, layer_bytes: list[tuple[int, int]]) -> list[Shard]:
        """The shards of the ``(layer, param_bytes)`` arrays over the servers."""
        return mxnet_shards(
            layer_bytes, self.S, int(self.job.options.get("big_array_bytes", 4_000_000))
        )

    def priority(self, k: int) -> float:
        """Send-queue priority of shard ``k``'s messages (``ps``: FIFO)."""
        return 0.0

    def server_rank(self, k: int) -> int:
        """The rank of the server keeping shard ``k``."""
        return self.W + self.shards[k].shard.server

    def label(self, kind: int, key: int) -> tuple[str, int]:
        """A message's name in the timeline and its layer (``push L3``, ``pull L3``)."""
        layer = self.shards[key].shard.layer if kind != STOP else -1
        return f"{KIND_NAMES[kind]} L{layer}", layer

    def expected(self, src: int) -> Iterator[tuple[int, int, int]]:
        """The payloads rank ``src`` sends this rank: values from a server, pushes from a
        worker, iteration by iteration (the messenger posts their receives ahead)."""
        for it in range(self.job.total_iterations):
            for kind, k in self.from_peer[src]:
                yield kind, k, it

    def buffer_for(self, _src: int, kind: int, key: int) -> torch.Tensor | None:
        """A tensor for an incoming payload (values or a push of shard ``key``)."""
        if kind in (VALUE, PUSH):
            return torch.empty(self.shards[key].numel, dtype=torch.float32)
        return None

    # ---- worker ----------------------------------------------------------------------
    def run(self) -> None:
        if self.ctx.is_worker:
            n = len(self.shards)
            self.left = {it: n for it in range(self.job.total_iterations)}
        self.msg.start()
        if self.ctx.is_worker:
            super().run()
        else:
            self.serve()
        self.msg.close()

    def grad_ready(self, layer: Any) -> None:
        ks = self.by_layer.get(layer.index, ())
        if not ks:
            return
        flat = layer.flat_grad().detach().to("cpu", torch.float32)
        it = self.iteration
        for k in ks:
            rs = self.shards[k]
            self.msg.send(
                self.server_rank(k),
                PUSH,
                k,
                it,
                flat[rs.offset : rs.offset + rs.numel],
                self.priority(k),
            )

    def before_layer(self, layer: Any) -> None:
        it = self.iteration
        if it > 0:
            self._load(layer, it - 1)

    def _load(self, layer: Any, it: int) -> None:
        """Wait for all of ``layer``'s shards of iteration ``it`` and load them."""
        if (layer.index, it) in self.loaded:
            return
        ks = self.by_layer.get(layer.index, ())
        start = self.rec.now()
        for k in ks:
            self.slots.wait((k, it), self.msg.check, self.job.timeout_s * 4)
        self.wait_span(start, f"wait L{layer.index}", self.iteration, layer.index)
        if ks:
            flat = torch.cat([self.values.pop((k, it)) for k in ks])
            layer.load_flat(flat)
            for k in ks:
                self.slots.discard((k, it))
        self.loaded.add((layer.index, it))

    def finish(self) -> None:
        last = self.job.total_iterations - 1
        for layer in self.setup.layers:
            self._load(layer, last)

    def on_message(self, src: int, kind: int, key: int, it: int, buf: Any, t: float) -> None:
        """Dispatch a received message (worker or server)."""
        if not self.ctx.is_worker:
            self._server_message(src, kind, key, it, buf)
            return
        if kind == VALUE:
            self.values[(key, it)] = buf
            self.slots.set((key, it))
            with self.lock:
                self.left[it] -= 1
                if self.left[it] == 0:
                    self.rec.end_iteration(it, t)
        elif kind == ACK:
            self.msg.send(src, PULL, key, it, None, self.priority(key))

    # ---- server ----------------------------------------------------------------------
    def _server_state(self) -> None:
        me = self.ctx.rank - self.W
        self.mine = [k for k, rs in enumerate(self.shards) if rs.shard.server == me]
        layers = {layer.index: layer for layer in self.setup.layers}
        self.params: dict[int, nn.Parameter] = {}
        self.opts: dict[int, torch.optim.Optimizer] = {}
        flats: dict[int, torch.Tensor] = {}
        for k in self.mine:
            rs = self.shards[k]
            li = rs.shard.layer
            if li not in flats:
                flats[li] = layers[li].flat_values().to("cpu", torch.float32)
            p = nn.Parameter(flats[li][rs.offset : rs.offset + rs.numel].clone())
            self.params[k] = p
            self.opts[k] = make_optimizer(self.job, [p])
        self.pushes: dict[tuple[int, int], dict[int, torch.Tensor]] = {}
        self.updated: dict[tuple[int, int], torch.Tensor] = {}
        self.pending_pulls: dict[tuple[int, int], list[int]] = {}
        self.to_send = len(self.mine) * self.W * self.job.total_iterations
        self.all_sent = threading.Event()
        if self.to_send == 0:
            self.all_sent.set()

    def serve(self) -> None:
        """Answer pushes until every shard of every iteration is served."""
        served = 0
        self.ctx.beat(0)
        while not self.all_sent.wait(0.2):
            self.msg.check()
            with self.lock:
                done = self._served_iterations()
            if done > served:
                served = done
                self.ctx.beat(served)

    def _served_iterations(self) -> int:
        """Iterations whose every shard of this server has been updated."""
        n = 0
        while self.mine and all((k, n) in self.updated for k in self.mine):
            n += 1
        return n

    def _server_message(self, src: int, kind: int, key: int, it: int, buf: Any) -> None:
        if kind == PUSH:
            with self.lock:
                got = self.pushes.setdefault((key, it), {})
                got[src] = buf
                complete = len(got) == self.W
            if not self.fused:
                self.msg.send(src, ACK, key, it, None, self.priority(key))
            if complete:
                self._update(key, it)
        elif kind == PULL:
            with self.lock:
                values = self.updated.get((key, it))
                if values is None:
                    self.pending_pulls.setdefault((key, it), []).append(src)
            if values is not None:
                self._send_values(key, it, [src], values)

    def _update(self, k: int, it: int) -> None:
        got = self.pushes.pop((k, it))
        start = self.rec.now()
        total = got[0].clone()
        for w in range(1, self.W):
            total += got[w]
        self.rec.span(
            COMPUTE,
            "aggregate",
            f"aggregate L{self.shards[k].shard.layer}",
            start,
            self.rec.now(),
            it,
            self.shards[k].shard.layer,
            nbytes=total.numel() * 4 * self.W,
        )
        start = self.rec.now()
        p = self.params[k]
        p.grad = total.div_(self.W)
        self.opts[k].step()
        values = p.detach().clone()
        self.rec.span(
            COMPUTE,
            UPDATE,
            f"update L{self.shards[k].shard.layer}",
            start,
            self.rec.now(),
            it,
            self.shards[k].shard.layer,
        )
        with self.lock:
            self.updated[(k, it)] = values
            waiting = self.pending_pulls.pop((k, it), [])
        targets = list(range(self.W)) if self.fused else waiting
        self._send_values(k, it, targets, values)

    def _send_values(self, k: int, it: int, workers: list[int], values: torch.Tensor) -> None:
        for w in workers:
            self.msg.send(w, VALUE, k, it, values, self.priority(k))
        with self.lock:
            self.to_send -= len(workers)
            if self.to_send <= 0:
                self.all_sent.set()
