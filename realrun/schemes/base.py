"""The training loop every data-parallel worker runs; schemes fill in its steps."""

from __future__ import annotations

from typing import Any

import torch

from realrun import emudevice
from realrun.runtime import (
    WAIT,
    LayerTimer,
    RealLayer,
    batch,
    loss_of,
    output_shape,
)
from realrun.worker import RankContext
from simcore.records import BACKWARD, COMPUTE, FORWARD
from traces.emulated import is_emulated_ref

MAX_PREPARED_BYTES = 1 << 30
"""Batches are made ahead of the run up to this many bytes per worker."""


class WorkerLoop:
    """Forward, loss, backward per iteration on one worker; a scheme overrides:

    * :meth:`inputs` (the batch of an iteration; gossip's shuffle replaces it),
    * :meth:`before_layer` (runs before a layer's forward: wait for values, update),
    * :meth:`grad_ready` (runs when backward has produced a layer's gradients),
    * :meth:`after_backward` (optimizer step, end of the iteration),
    * :meth:`finish` (after the last iteration: wait for what is still in flight).

    With a data set (``job.data``) the loop keeps each batch's loss and the weights at
    every epoch's end (as the forward of the epoch's first iteration sees them: every
    scheme has applied all earlier updates by then; the last epoch's after
    :meth:`finish`), for ``sim train --real``.

    :attr:`model` is what forward calls (a DDP wrapper for ``dp``).

    The worker's batches are made before the clock starts (:meth:`prepare_data`), as a
    data loader that keeps up would deliver them, unless they would take more than
    :data:`MAX_PREPARED_BYTES`. On a GPU (or an emulated device) the loop synchronises
    after forward, backward and the iteration's last step, so those ends are the device's;
    the per-layer spans in between would be host-side launch times, so there it records one
    span per
    pass instead (per-layer GPU times come from ``--profile-out``, CUDA events).
    """

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.job = ctx.job
        self.rec = ctx.rec
        self.setup = ctx.setup
        self.model: Any = ctx.setup.model
        self.iteration = -1
        self._prepared: dict[int, tuple[tuple[torch.Tensor, ...], torch.Tensor]] = {}
        self.label_spec = output_shape(self.job)
        self.record_layers = (
            self.job.record_layers
            and self.setup.device.type != "cuda"
            and not is_emulated_ref(self.job.model)
        )
        if ctx.is_worker:
            self.prepare_data(range(self.job.total_iterations + 1))

    # ---- steps a scheme overrides ----------------------------------------------------
    def inputs(self, it: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """This worker's batch of iteration ``it``."""
        return self.own_batch(it)

    def own_batch(self, it: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """This worker's own batch of iteration ``it`` (prepared, or made now)."""
        hit = self._prepared.pop(it, None)
        return hit if hit is not None else batch(self.job, self.ctx.rank, it, *self.label_spec)

    def prepare_data(self, iterations: range) -> None:
        """Make this worker's batches of ``iterations`` now (see class docs)."""
        first = batch(self.job, self.ctx.rank, iterations.start, *self.label_spec)
        size = sum(t.numel() * t.element_size() for t in (*first[0], first[1]))
        if size * len(iterations) > MAX_PREPARED_BYTES:
            return
        self._prepared[iterations.start] = first
        for it in iterations[1:]:
            self._prepared[it] = batch(self.job, self.ctx.rank, it, *self.label_spec)

    def sync(self) -> None:
        """Wait for the device's queued work (GPU, emulated device); nothing on a CPU."""
        if self.setup.device.type == "cuda":
            torch.cuda.synchronize(self.setup.device)
        emudevice.sync()

    def before_layer(self, layer: RealLayer) -> None:
        """Before ``layer``'s forward in :attr:`iteration`."""

    def grad_ready(self, layer: RealLayer) -> None:
        """``layer``'s gradients of :attr:`iteration` are complete."""

    def after_backward(self, it: int) -> None:
        """Backward of ``it`` is done."""

    def finish(self) -> None:
        """After the last iteration."""

    # ---- the loop --------------------------------------------------------------------
    def run(self) -> None:
        """Train for the job's warm-up and measured iterations."""
        if not self.ctx.is_worker:
            self.serve()
            return
        timer = LayerTimer(self.setup, self.rec, self.record_layers)
        timer.before_forward = self.before_layer
        timer.on_grad_ready = self.grad_ready
        device = self.setup.device
        epoch_updates = 0
        if self.job.data:
            from realrun import data

            epoch_updates = data.updates_per_epoch(self.job)
        epoch_weights: dict[int, dict[str, torch.Tensor]] = {}
        losses: list[list[float]] = []
        for it in range(self.job.total_iterations):
            self.iteration = it
            self.ctx.beat(it)
            inputs, labels = self.inputs(it)
            inputs = tuple(t.to(device) for t in inputs)
            self.setup.model.zero_grad(set_to_none=True)
            timer.start_forward(it)
            start = self.rec.now()
            out = self.model(*inputs)
            loss = loss_of(out, labels)
            self.sync()
            if epoch_updates:
                # this forward ran on the weights of every update before ``it``
                losses.append([it, float(loss.detach())])
                if it and it % epoch_updates == 0:
                    epoch_weights[it // epoch_updates] = self._weights()
            if not self.record_layers:
                self.rec.span(COMPUTE, FORWARD, "forward", start, self.rec.now(), it)
            self.ctx.beat(it, 1)
            start = self.rec.now()
            timer.start_backward()
            loss.backward()
            if self.record_layers:
                # what backward() does after the last layer's gradients (DDP: waiting for
                # the last buckets' all-reduce and unpacking them) is no layer's compute
                self.wait_span(timer.last_grad_s, "end of backward", it)
            timer.finish_backward()
            self.sync()
            if not self.record_layers:
                self.rec.span(COMPUTE, BACKWARD, "backward", start, self.rec.now(), it)
            self.ctx.beat(it, 2)
            self.after_backward(it)
            self.sync()
            self.rec.end_iteration(it)
            self.ctx.beat(it, 3)
        self.finish()
        if epoch_updates:
            if self.job.total_iterations % epoch_updates == 0:
                epoch_weights[self.job.total_iterations // epoch_updates] = self._weights()
            self.ctx.extra.update({"losses": losses, "epoch_weights": epoch_weights})

    def _weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.setup.model.named_parameters()}

    def serve(self) -> None:
        """A server rank's work (schemes with servers override it)."""
        raise RuntimeError(f"{self.job.scheme} has no server ranks; the job must have none")

    def wait_span(self, start: float, what: str, it: int, layer: int = -1) -> None:
        """Record a wait on the compute stream from ``start`` to now, if it lasted."""
        end = self.rec.now()
        if end - start > 20e-6:
            self.rec.span(COMPUTE, WAIT, what, start, end, it, layer)
