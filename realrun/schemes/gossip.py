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

**Messages.** Every message a worker will get is known from the partner schedule (the
partner's gradients of every layer, its batch), so the worker keeps gloo receives posted
ahead for them and sends with ``isend`` (:class:`realrun.p2p.PostedLink`): no Python
thread carries them. An iteration ends for a worker once it has its partner's gradients
of that iteration.

The receives are posted one iteration's messages ahead, no more: the next iteration's are
posted as this iteration's are used (during the next forward, before backward sends), so
a worker whose partner is still busy with its previous exchange waits for the partner's
ready notice instead of pushing into a link that is still receiving (gloo sends after the
receiver's notice). Two iterations ahead let drifting workers overlap exchanges with
different partners on one link: ``mlp_medium`` on four ranks at 1 Gbit/s took 172-181 ms
an iteration instead of 110-112 ms (two runs each, measured).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from realrun.p2p import Expected, PostedLink
from realrun.runtime import (
    BATCH,
    GRAD,
    RealLayer,
    batch,
    make_optimizer,
)
from realrun.schemes.base import WorkerLoop
from realrun.worker import RankContext
from simcore.records import COMPUTE, UPDATE
from simcore.schemes.gossip import partners

KEY_STRIDE = 1 << 16
"""Message key: ``iteration * KEY_STRIDE + layer index`` (or batch tensor index)."""


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
        self.updated: set[tuple[int, int]] = set()
        self.left: dict[int, int] = {}
        self.label_bytes = 0
        self.link: PostedLink | None = None

    def partners_of(self, it: int) -> tuple[int, int]:
        """``(send_to, recv_from)`` of this rank in iteration ``it``."""
        send, recv = partners(self.p, it, self.schedule, self.rotation)
        return send[self.ctx.rank], recv[self.ctx.rank]

    @staticmethod
    def label(kind: int, key: int) -> tuple[str, int]:
        """A message's name in the timeline and its layer."""
        if kind == GRAD:
            return f"grad L{key % KEY_STRIDE}", key % KEY_STRIDE
        return "batch", -1

    def _expected(self) -> Iterator[Expected]:
        """Every message this worker gets, iteration by iteration: the partner's batch
        (with shuffle), then its gradients in forward order (the order they are used)."""
        for it in range(self.job.total_iterations):
            _send, src = self.partners_of(it)
            if self.shuffle:
                for key, t in enumerate(self.template):
                    yield src, BATCH, it * KEY_STRIDE + key, it, torch.empty_like(t)
            for layer in self.setup.layers:
                buf = torch.empty(layer.numel, dtype=torch.float32)
                yield src, GRAD, it * KEY_STRIDE + layer.index, it, buf

    def _batch_tensors(self, rank: int, it: int) -> list[torch.Tensor]:
        inputs, labels = batch(self.job, rank, it, *self.label_spec)
        return [*inputs, labels]

    def run(self) -> None:
        self.template = self._batch_tensors(0, 0)
        if self.p > 1:
            per_it = len(self.layers) + (len(self.template) if self.shuffle else 0)
            self.link = PostedLink(
                self.ctx.rank,
                self.job.world_size,
                self.ctx.group,
                self.rec,
                self._expected(),
                per_it,  # one iteration ahead (module docs)
                self.label,
                self.job.timeout_s * 4,
            )
        super().run()
        if self.link is not None:
            self.link.close(drain=True)  # the last iteration's batch is never trained on
        self.ctx.extra["shuffle_label_bytes"] = self.label_bytes

    # ---- data ------------------------------------------------------------------------
    def inputs(self, it: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        if self.shuffle:
            send_to, _recv = self.partners_of(it)
            nxt = self.own_batch(it + 1)
            for key, t in enumerate([*nxt[0], nxt[1]]):
                self.link.send(send_to, BATCH, it * KEY_STRIDE + key, it, t)
                if key == len(self.template) - 1 and it >= self.job.warmup_iterations:
                    self.label_bytes += t.numel() * t.element_size()
        if it == 0 or not self.shuffle:
            return super().inputs(it)
        start = self.rec.now()
        tensors = [
            self.link.wait(BATCH, (it - 1) * KEY_STRIDE + key) for key in range(len(self.template))
        ]
        self.wait_span(start, "wait batch", it)
        return tuple(tensors[:-1]), tensors[-1]

    # ---- gradients -------------------------------------------------------------------
    def grad_ready(self, layer: RealLayer) -> None:
        it = self.iteration
        flat = layer.flat_grad().detach().to("cpu", torch.float32)
        self.own[(layer.index, it)] = flat
        if self.p > 1:
            send_to, _recv = self.partners_of(it)
            self.link.send(send_to, GRAD, it * KEY_STRIDE + layer.index, it, flat)

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
            theirs = self.link.wait(GRAD, it * KEY_STRIDE + layer.index)
            self.wait_span(start, f"wait L{layer.index}", self.iteration, layer.index)
            g = (g + theirs) / 2
            self.left[it] = self.left.get(it, len(self.layers)) - 1
            if self.left[it] == 0:  # the partner's gradients of ``it`` are all here
                self.rec.end_iteration(it)
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
