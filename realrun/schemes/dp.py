"""``dp`` for real: torch's DistributedDataParallel with the simulator's bucket layout.

The buckets are :func:`simcore.schemes.dp.ddp_bucket_layout` of the model's layers (the
same call the simulator makes on the trace), handed to DDP as ``bucket_cap_mb_list``: a
bucket's cap is exactly its bytes, so DDP closes it after the same layer. A communication
hook runs each bucket's all-reduce (gloo's ring, or NCCL's) and records its span on the
``comm`` stream; its bytes are the ring's, ``2 (p-1)/p`` of the bucket per rank, the
simulator's accounting. ``overlap=false`` runs backward without synchronisation and then
all-reduces the buckets one after another, as the simulator does. After the gradients are
averaged every rank runs the optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from realrun import emudevice
from realrun.runtime import make_optimizer
from realrun.schemes.base import WorkerLoop
from realrun.worker import RankContext
from simcore.collectives import ring_bytes_sent
from simcore.records import COMM, COMPUTE, UPDATE
from simcore.schemes.dp import ddp_bucket_layout


class DPRuntime(WorkerLoop):
    """DDP with the simulator's buckets (see module docs)."""

    def __init__(self, ctx: RankContext) -> None:
        super().__init__(ctx)
        opts = self.job.options
        algorithm = opts.get("algorithm", "ring")
        if algorithm != "ring":
            raise ValueError(
                f"scheme.algorithm={algorithm}: gloo and NCCL all-reduce "
                "with a ring here; only ring runs for real"
            )
        layer_bytes = [pb for _n, pb, _k in self.setup.trace_layers]
        self.layout = ddp_bucket_layout(
            layer_bytes,
            int(opts.get("bucket_bytes", 25 << 20)),
            int(opts.get("first_bucket_bytes", 1 << 20)),
        )
        self.bucket_bytes = [sum(layer_bytes[i] for i in b) for b in self.layout]
        self.overlap = bool(opts.get("overlap", True))
        self.p = self.job.workers
        self.optimizer = make_optimizer(self.job, list(self.setup.model.parameters()))
        self.seen_buckets: dict[int, int] = {}
        if self.p > 1:
            caps = [b / 2**20 for b in self.bucket_bytes] or [25.0]
            self.model = DistributedDataParallel(
                self.setup.model,
                bucket_cap_mb_list=caps,
                device_ids=[self.setup.device.index] if self.setup.device.type == "cuda" else None,
            )
            self.model.register_comm_hook(None, self._hook)
        ctx.extra["buckets_planned_bytes"] = self.bucket_bytes

    def _ring_bytes(self, nbytes: int) -> int:
        return ring_bytes_sent(self.ctx.rank, self.p, nbytes)

    def _hook(self, _state, bucket):  # unannotated: DDP checks the annotations
        emudevice.sync()  # an emulated device's gradients exist once its queue has run
        buf = bucket.buffer()
        it = self.iteration
        nbytes = buf.numel() * buf.element_size()
        index = bucket.index()
        if it >= self.job.warmup_iterations:
            self.seen_buckets[index] = nbytes
        start = self.rec.now()
        fut = dist.all_reduce(buf, async_op=True).get_future()
        rank = self.ctx.rank

        def done(f: torch.futures.Future[Any]) -> torch.Tensor:
            self.rec.span(
                COMM, "allreduce", f"bucket{index}", start, self.rec.now(), it, nbytes=nbytes
            )
            self.rec.count_sent((rank + 1) % self.p, it, self._ring_bytes(nbytes), "allreduce")
            out = f.value()[0]
            return out.div_(self.p)

        return fut.then(done)

    def run(self) -> None:
        if self.p > 1 and not self.overlap:
            with self.model.no_sync():
                super().run()
        else:
            super().run()
        sizes = [self.seen_buckets[k] for k in sorted(self.seen_buckets)]
        self.ctx.extra["buckets_measured_bytes"] = sizes

    def after_backward(self, it: int) -> None:
        if self.p > 1 and not self.overlap:
            self._reduce_after_backward(it)
        start = self.rec.now()
        self.optimizer.step()
        self.sync()
        self.rec.span(COMPUTE, UPDATE, "optimizer step", start, self.rec.now(), it)

    def _reduce_after_backward(self, it: int) -> None:
        """The buckets one after another once backward is done (``overlap=false``)."""
        by_layer = {layer.index: layer for layer in self.setup.layers}
        for k, bucket in enumerate(self.layout):
            params = [p for i in bucket if i in by_layer for p in by_layer[i].params]
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                    for p in params
                ]
            )
            nbytes = flat.numel() * flat.element_size()
            start = self.rec.now()
            dist.all_reduce(flat)
            self.rec.span(COMM, "allreduce", f"bucket{k}", start, self.rec.now(), it, nbytes=nbytes)
            self.rec.count_sent(
                (self.ctx.rank + 1) % self.p, it, self._ring_bytes(nbytes), "allreduce"
            )
            if it >= self.job.warmup_iterations:
                self.seen_buckets[k] = nbytes
            flat.div_(self.p)
            off = 0
            for p in params:
                n = p.numel()
                p.grad = flat[off : off + n].view_as(p).clone()
                off += n
