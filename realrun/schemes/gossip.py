"""``gossip`` for real: GossipGraD's pairwise gradient exchange.

Iteration ``t``'s partners are :func:`simcore.schemes.gossip.partners` (the schedule and
rotation the simulator uses): each worker sends to ``send_to[r]`` and receives from
``recv_from[r]`` (the same rank on the hypercube). As backward produces a layer's
gradients the worker sends them to its partner; just before that layer's next forward it
waits for the partner's gradients of the layer, averages, ``g = (g + g_partner) / 2``, and
applies the optimizer step to the layer alone. After the last iteration the pending
averages are applied, so the weights hold every iteration's update. Nothing else couples
the workers.

**Shuffle** (``shuffle=true``): worker ``r`` reads its own stream of batches; during
iteration ``t``'s forward it sends its next own batch (``t + 1``) to ``send_to[r]`` and
trains iteration ``t + 1`` on the batch it received from ``recv_from[r]``. Samples move
between workers as GossipGraD's sample shuffle moves them, one batch per iteration, and
each own batch is trained once (iteration 0's by its owner). The simulator counts the
batch's input bytes; the labels that travel with it (int64 per sample) are counted apart,
as ``shuffle_label_bytes``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from realrun.runtime import (
    BATCH,
    GRAD,
    Messenger,
    RealLayer,
    Slots,
    batch,
    make_optimizer,
)
from realrun.schemes.base import WorkerLoop
from realrun.worker import RankContext
from simcore.records import COMPUTE, UPDATE
from simcore.schemes.gossip import partners


class GossipRuntime(WorkerLoop):
    """GossipGraD (see module docs)."""

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        opts = self.job.options
        self.p = self.job.workers
        self.schedule = str(opts.get("schedule", "hypercube"))
        self.rotation = str(opts.get("rotation", "singer"))
        self.shuffle = bool(opts.get("shuffle", True)) and self.p > 1
        self.layers = {layer.index: layer for layer in self.setup.layers}
        self.optimizers = {
            i: make_optimizer(self.job, layer.params) for i, layer in self.layers.items()
        }
        self.own: dict[tuple[int, int], torch.Tensor] = {}
        self.theirs: dict[tuple[int, int], torch.Tensor] = {}
        self.batches: dict[tuple[int, int], torch.Tensor] = {}
        self.updated: set[tuple[int, int]] = set()
        self.slots = Slots()
        self.lock = threading.Lock()
        self.left: dict[int, int] = {}
        self.label_bytes = 0
        peers = [r for r in range(self.p) if r != ctx.rank]
        self.msg = Messenger(
            ctx.rank,
            self.job.world_size,
            peers,
            self.rec,
            ctx.group,
            self.on_message,
            self.buffer_for,
            self.label,
        )

    def partners_of(self, it: int) -> tuple[int, int]:
        """``(send_to, recv_from)`` of this rank in iteration ``it``."""
        send, recv = partners(self.p, it, self.schedule, self.rotation)
        return send[self.ctx.rank], recv[self.ctx.rank]

    @staticmethod
    def label(kind: int, key: int) -> tuple[str, int]:
        """A message's name in the timeline and its layer."""
        if kind == GRAD:
            return f"grad L{key}", key
        return "batch", -1

    def buffer_for(self, _src: int, kind: int, key: int) -> torch.Tensor | None:
        if kind == GRAD:
            return torch.empty(self.layers[key].numel, dtype=torch.float32)
        if kind == BATCH:
            return torch.empty_like(self.template[key])
        return None

    def _batch_tensors(self, rank: int, it: int) -> list[torch.Tensor]:
        inputs, labels = batch(self.job, rank, it, *self.label_spec)
        return [*inputs, labels]

    def run(self) -> None:
        self.template = self._batch_tensors(0, 0)
        expected = len(self.layers) + (len(self.template) if self.shuffle else 0)
        self.left = {it: expected for it in range(self.job.total_iterations)}
        self.msg.start()
        super().run()
        self.msg.close()
        self.ctx.extra["shuffle_label_bytes"] = self.label_bytes

    # ---- data ------------------------------------------------------------------------
    def inputs(self, it: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        if self.shuffle:
            send_to, _recv = self.partners_of(it)
            nxt = self.own_batch(it + 1)
            for key, t in enumerate([*nxt[0], nxt[1]]):
                self.msg.send(send_to, BATCH, key, it, t)
                if key == len(self.template) - 1 and it >= self.job.warmup_iterations:
                    self.label_bytes += t.numel() * t.element_size()
        if it == 0 or not self.shuffle:
            return super().inputs(it)
        start = self.rec.now()
        tensors = []
        for key in range(len(self.template)):
            self.slots.wait(("batch", key, it - 1), self.msg.check, self.job.timeout_s * 4)
            tensors.append(self.batches.pop((key, it - 1)))
        self.wait_span(start, "wait batch", it)
        return tuple(tensors[:-1]), tensors[-1]

    # ---- gradients -------------------------------------------------------------------
    def grad_ready(self, layer: RealLayer) -> None:
        it = self.iteration
        flat = layer.flat_grad().detach().to("cpu", torch.float32)
        self.own[(layer.index, it)] = flat
        if self.p > 1:
            send_to, _recv = self.partners_of(it)
            self.msg.send(send_to, GRAD, layer.index, it, flat)

    def before_layer(self, layer: RealLayer) -> None:
        if self.iteration > 0:
            self._apply(layer, self.iteration - 1)

    def _apply(self, layer: RealLayer, it: int) -> None:
        """Average ``layer``'s gradients of ``it`` with the partner's and step."""
        if (layer.index, it) in self.updated:
            return
        self.updated.add((layer.index, it))
        g = self.own.pop((layer.index, it))
        if self.p > 1:
            start = self.rec.now()
            self.slots.wait(("grad", layer.index, it), self.msg.check, self.job.timeout_s * 4)
            self.wait_span(start, f"wait L{layer.index}", self.iteration, layer.index)
            g = (g + self.theirs.pop((layer.index, it))) / 2
        start = self.rec.now()
        layer.set_grad(g.to(layer.params[0].device))
        self.optimizers[layer.index].step()
        for p in layer.params:  # this iteration's backward accumulates from zero
            p.grad = None
        self.rec.span(
            COMPUTE,
            UPDATE,
            f"update L{layer.index}",
            start,
            self.rec.now(),
            self.iteration,
            layer.index,
        )

    def finish(self) -> None:
        last = self.job.total_iterations - 1
        for layer in self.setup.layers:
            self._apply(layer, last)

    def on_message(self, _src: int, kind: int, key: int, it: int, buf: Any, t: float) -> None:
        if kind == GRAD:
            self.theirs[(key, it)] = buf
            self.slots.set(("grad", key, it))
        elif kind == BATCH:
            self.batches[(key, it)] = buf
            self.slots.set(("batch", key, it))
        with self.lock:
            self.left[it] -= 1
            if self.left[it] == 0:
                self.rec.end_iteration(it, t)
