"""``gossip`` for real: GossipGraD's pairwise exchange.

Iteration ``t``'s partners are :func:`simcore.schemes.gossip.partners` (the schedule and
rotation the simulator uses): each worker sends to ``send_to[r]`` and receives from
``recv_from[r]`` (the same rank on the hypercube). Every worker builds its model from the
job's seed, so all start from the same weights (rank 0's). What partners exchange is
``exchange`` (:data:`simcore.schemes.gossip.EXCHANGES`), one message per layer:

* ``weights`` (default; the authors' final versions): at the start of iteration ``t``
  (before its forward) the worker waits for the messages its partner of ``t - 1`` sent at
  the start of ``t - 1``, sets each layer's weights and optimizer state (SGD's momentum
  buffer, Adam's moments; zeros before the first step) to the mean of its own and the
  partner's, then sends its own to its partner of ``t``. Forward, backward and one
  optimizer step per layer follow, on the worker's own gradient.
* ``gradients``: as backward produces a layer's gradients the worker sends them; just
  before that layer's next forward it waits for the partner's, averages, ``g = (g +
  g_partner) / 2``, and steps the layer alone.
* ``gradients+weights`` (the authors' version 1): as ``gradients``, each message also
  carrying the layer's weights (those its forward used); before the step the worker sets
  the layer's weights to the mean of its own and the partner's.

After the last iteration the pending averages are applied, so the weights hold every
exchange. Nothing else couples the workers.

**Shuffle** (``shuffle=true``): worker ``r`` reads its own stream of batches; during
iteration ``t``'s forward it sends its next own batch (``t + 1``) to ``send_to[r]`` and
trains iteration ``t + 1`` on the batch it received from ``recv_from[r]``. Samples move
between workers as GossipGraD's sample shuffle moves them, one batch per iteration, and
each own batch is trained once (iteration 0's by its owner). The simulator counts the
batch's input bytes; the labels that travel with it (int64 per sample) are counted apart,
as ``shuffle_label_bytes``.

**Messages.** Every message a worker will get is known from the partner schedule (the
partner's message of every layer, its batch), so the worker keeps gloo receives posted
ahead for them and sends with ``isend`` (:class:`realrun.p2p.PostedLink`): no Python
thread carries them. An iteration ends for a worker once it has its partner's messages
of that iteration.

Receives are posted one iteration ahead, no more (docs/p3_gossip.md has the
measurements). Exchanging weights, a worker posts iteration ``t``'s receives, its
batch's with them, once it has mixed in every layer of ``t - 1`` and before it sends its
own model of ``t``: a ready notice travels in the TCP stream behind the data the worker sends the
same peer, so a receive posted after the model would hold the partner's batch; posted
any earlier, a partner that is ahead pushes its next model into the link that still
carries the one the worker waits for, and the delay passes from worker to worker.
Exchanging gradients, each receive of iteration ``t`` is posted as the message of its
slot in ``t - 1`` is used; a worker whose partner is still busy with its previous
exchange waits for the partner's ready notice.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from realrun.p2p import Expected, PostedLink
from realrun.runtime import (
    BATCH,
    GRAD,
    WEIGHTS,
    RealLayer,
    batch,
    make_optimizer,
)
from realrun.schemes.base import WorkerLoop
from realrun.worker import RankContext
from simcore.records import COMPUTE, UPDATE
from simcore.schemes.gossip import GossipOptions, exchanged_copies, partners

KEY_STRIDE = 1 << 16
"""Message key: ``iteration * KEY_STRIDE + layer index`` (or batch tensor index)."""


def state_keys(opt: torch.optim.Optimizer) -> list[str]:
    """The optimizer state a gossip message carries and averages: SGD with momentum its
    momentum buffer, Adam its two moments, plain SGD none."""
    group = opt.param_groups[0]
    if "betas" in group:
        return ["exp_avg", "exp_avg_sq"]
    return ["momentum_buffer"] if group.get("momentum", 0.0) else []


def pack(opt: torch.optim.Optimizer, params: list[torch.Tensor]) -> torch.Tensor:
    """A layer's message, exchanging weights: ``params``' values, then each of
    :func:`state_keys` of every parameter (zeros where the optimizer has none yet),
    flattened into one new tensor (each array read once, the message written once)."""
    parts = [p.detach().reshape(-1) for p in params]
    for key in state_keys(opt):
        for p in params:
            t = opt.state.get(p, {}).get(key)
            parts.append((t if t is not None else torch.zeros_like(p)).detach().reshape(-1))
    return torch.cat(parts)


def mix_in(opt: torch.optim.Optimizer, params: list[torch.Tensor], theirs: torch.Tensor) -> None:
    """Average a partner's message (laid out as :func:`pack` lays it out) into
    ``params`` and the optimizer's state, in place: each value becomes the mean of its
    own and the partner's (``lerp`` at one half: read both, write one). Where the
    optimizer has no momentum buffer yet, the mean of zeros and the partner's is set."""
    off = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.lerp_(theirs[off : off + n].view_as(p), 0.5)
            off += n
        for key in state_keys(opt):
            for p in params:
                n = p.numel()
                part = theirs[off : off + n].view_as(p)
                state = opt.state.get(p)
                if state is not None and state.get(key) is not None:
                    state[key].lerp_(part, 0.5)
                elif key == "momentum_buffer" and state is not None and part.any():
                    state[key] = part / 2
                off += n


def receive_window(layers: int, batch_messages: int, by_weights: bool) -> int | None:
    """How many receives a gossip worker keeps posted (module docs): exchanging
    gradients, one iteration's messages, each posted as the previous iteration's message
    of its slot is used; exchanging weights None, for an iteration at a time (the worker
    posts iteration ``it``'s, its batch with them, once it has mixed in every layer of
    ``it - 1``, before it sends its model)."""
    return None if by_weights else layers + batch_messages


class GossipRuntime(WorkerLoop):
    """GossipGraD (see module docs)."""

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        opts = self.job.options
        defaults = GossipOptions()
        self.p = self.job.workers
        self.schedule = str(opts.get("schedule", defaults.schedule))
        self.rotation = str(opts.get("rotation", defaults.rotation))
        self.exchange = str(opts.get("exchange", defaults.exchange))
        self.by_weights = self.exchange == "weights"
        self.copies = exchanged_copies(self.job.optimizer, self.exchange)
        self.kind = WEIGHTS if self.by_weights else GRAD
        self.shuffle = bool(opts.get("shuffle", defaults.shuffle)) and self.p > 1
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
        if kind == WEIGHTS:
            return f"weights L{key % KEY_STRIDE}", key % KEY_STRIDE
        return "batch", -1

    def _expected(self) -> Iterator[Expected]:
        """Every message this worker gets, iteration by iteration, in the order it uses
        them: exchanging weights, the partner's layers in forward order (used at the next
        iteration's start) and then its batch (with shuffle); otherwise the batch, then the
        partner's layers in forward order (used before each layer's forward)."""
        for it in range(self.job.total_iterations):
            _send, src = self.partners_of(it)
            batches = [
                (src, BATCH, it * KEY_STRIDE + key, it, torch.empty_like(t))
                for key, t in enumerate(self.template)
                if self.shuffle
            ]
            layers = [
                (
                    src,
                    self.kind,
                    it * KEY_STRIDE + layer.index,
                    it,
                    torch.empty(self.copies * layer.numel, dtype=torch.float32),
                )
                for layer in self.setup.layers
            ]
            yield from (layers + batches) if self.by_weights else (batches + layers)

    def _batch_tensors(self, rank: int, it: int) -> list[torch.Tensor]:
        inputs, labels = batch(self.job, rank, it, *self.label_spec)
        return [*inputs, labels]

    def run(self) -> None:
        self.template = self._batch_tensors(0, 0)
        if self.p > 1:
            n_batch = len(self.template) if self.shuffle else 0
            self.link = PostedLink(
                self.ctx.rank,
                self.job.world_size,
                self.ctx.group,
                self.rec,
                self._expected(),
                receive_window(len(self.layers), n_batch, self.by_weights),
                self.label,
                self.job.timeout_s * 4,
            )
            if self.by_weights:
                self.link.post_through(0)
        super().run()
        if self.link is not None:
            self.link.close(drain=True)  # the last iteration's batch is never trained on
        self.ctx.extra["shuffle_label_bytes"] = self.label_bytes

    # ---- data ------------------------------------------------------------------------
    def inputs(self, it: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        if self.by_weights and self.p > 1:
            if it > 0:
                self._mix(it - 1)
            send_to, _recv = self.partners_of(it)
            for layer in self.setup.layers:
                flat = pack(self.optimizers[layer.index], layer.params)
                self.link.send(send_to, WEIGHTS, it * KEY_STRIDE + layer.index, it, flat.cpu())
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

    # ---- exchanging weights ------------------------------------------------------------
    def _mix(self, it: int) -> None:
        """Average the partner's weights and optimizer state of iteration ``it`` into
        every layer (exchange ``weights``)."""
        for layer in self.setup.layers:
            start = self.rec.now()
            theirs = self.link.wait(WEIGHTS, it * KEY_STRIDE + layer.index)
            self.wait_span(start, f"wait L{layer.index}", it + 1, layer.index)
            start = self.rec.now()
            theirs = theirs.to(layer.params[0].device)
            mix_in(self.optimizers[layer.index], layer.params, theirs)
            self.rec.span(
                COMPUTE, UPDATE, f"average L{layer.index}", start, self.rec.now(), it + 1,
                layer.index,
            )  # fmt: skip
        self.rec.end_iteration(it)  # the partner's messages of ``it`` are all here
        self.link.post_through(it + 1)

    def after_backward(self, it: int) -> None:
        if not self.by_weights:
            return
        for layer in self.setup.layers:
            start = self.rec.now()
            self.optimizers[layer.index].step()
            self.rec.span(
                COMPUTE, UPDATE, f"update L{layer.index}", start, self.rec.now(), it, layer.index
            )

    # ---- exchanging gradients -----------------------------------------------------------
    def grad_ready(self, layer: RealLayer) -> None:
        if self.by_weights:
            return
        it = self.iteration
        flat = layer.flat_grad().detach().to("cpu", torch.float32)
        self.own[(layer.index, it)] = flat
        if self.p > 1:
            send_to, _recv = self.partners_of(it)
            if self.exchange == "gradients+weights":
                flat = torch.cat([flat, layer.flat_values().to("cpu", torch.float32)])
            self.link.send(send_to, GRAD, it * KEY_STRIDE + layer.index, it, flat)

    def before_layer(self, layer: RealLayer) -> None:
        if self.iteration > 0 and not self.by_weights:
            self._apply(layer, self.iteration - 1)

    def _apply(self, layer: RealLayer, it: int) -> None:
        """Average ``layer``'s gradients of ``it`` (and with ``gradients+weights`` its
        weights) with the partner's and step."""
        if (layer.index, it) in self.updated:
            return
        self.updated.add((layer.index, it))
        g = self.own.pop((layer.index, it))
        device = layer.params[0].device
        if self.p > 1:
            start = self.rec.now()
            theirs = self.link.wait(GRAD, it * KEY_STRIDE + layer.index)
            self.wait_span(start, f"wait L{layer.index}", self.iteration, layer.index)
            n = layer.numel
            g = (g + theirs[:n]) / 2
            if self.exchange == "gradients+weights":
                layer.load_flat((layer.flat_values() + theirs[n:].to(device)) / 2)
            self.left[it] = self.left.get(it, len(self.layers)) - 1
            if self.left[it] == 0:  # the partner's gradients of ``it`` are all here
                self.rec.end_iteration(it)
        start = self.rec.now()
        layer.set_grad(g.to(device))
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
        if self.by_weights:
            if self.p > 1:
                self._mix(last)
            return
        for layer in self.setup.layers:
            self._apply(layer, last)
