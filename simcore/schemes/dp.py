"""``dp``: synchronous data parallelism with all-reduce, overlapped like PyTorch DDP.

Every rank holds the whole model and runs forward and backward on its own
``batch_size`` samples. Gradients are grouped into buckets in reverse layer order (the
first bucket holds ``first_bucket_bytes``, the others ``bucket_bytes``, as DDP does); a
bucket's all-reduce starts once every rank has produced its last gradient, and buckets are
reduced one after another on a single communication stream. After the last bucket each
rank runs the optimizer step and starts the next iteration.

Memory per GPU: weights, gradients, optimizer state, DDP's bucket buffers (one copy of
the gradients) and the activations of one batch, held from forward until backward frees
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from simpy import Event

from simcore.collectives import ALLREDUCE_ALGORITHMS
from simcore.config import option
from simcore.records import BACKWARD, UPDATE
from simcore.schemes._ops import LayerOps
from simcore.schemes.base import Scheme
from simcore.work import SchemeWork, Workload
from traces.model import Trace


@dataclass(frozen=True)
class DPOptions:
    """Options of ``dp``."""

    algorithm: str = option("ring", "all-reduce algorithm", choices=ALLREDUCE_ALGORITHMS)
    bucket_bytes: int = option(
        25 * 2**20, "gradient bucket size (DDP's bucket_cap_mb)", unit="bytes", minimum=1
    )
    first_bucket_bytes: int = option(
        2**20, "size of the first (last layers') bucket", unit="bytes", minimum=1
    )
    overlap: bool = option(
        True,
        "start a bucket's all-reduce as soon as its gradients are "
        "ready (false: after the whole backward)",
    )


def ddp_buckets(trace: Trace, bucket_bytes: int, first_bucket_bytes: int) -> list[list[int]]:
    """Layer indices per bucket, as DDP assigns them (:func:`ddp_bucket_layout` of the
    trace's layer parameter bytes)."""
    return ddp_bucket_layout(
        [layer.param_bytes for layer in trace.layers], bucket_bytes, first_bucket_bytes
    )


def ddp_bucket_layout(
    param_bytes: Sequence[int], bucket_bytes: int, first_bucket_bytes: int
) -> list[list[int]]:
    """Layer indices per bucket, as DDP assigns them: walking the layers with parameters
    (``param_bytes[i] > 0``) from last to first, a bucket is closed once it holds at least
    its cap (the first bucket's cap is ``first_bucket_bytes``). The real runtime hands
    these sizes to DDP as ``bucket_cap_mb_list``."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    cap = first_bucket_bytes
    for i in range(len(param_bytes) - 1, -1, -1):
        pb = param_bytes[i]
        if pb <= 0:
            continue
        current.append(i)
        size += pb
        if size >= cap:
            buckets.append(current)
            current, size, cap = [], 0, bucket_bytes
    if current:
        buckets.append(current)
    return buckets


class DataParallel(Scheme):
    """All-reduce data parallelism (see module docs)."""

    name = "dp"
    summary = "data parallelism, all-reduce of DDP-style gradient buckets overlapped with backward"
    Options = DPOptions
    same_numerics = True
    real_runtime = "realrun.schemes.dp:DPRuntime"
    real_backends = ("gloo", "nccl")
    convergence_variants = MappingProxyType({"dp": {}})

    @classmethod
    def real_refusal(cls, options: Any, workers: int) -> tuple[str, str] | None:
        if options.algorithm != "ring":
            return (
                "scheme.algorithm",
                f"{options.algorithm!r} is not allowed for a real run; gloo and NCCL "
                "all-reduce with a ring (ring)",
            )
        return super().real_refusal(options, workers)

    @classmethod
    def estimate_work(cls, work: Workload) -> SchemeWork:
        """One all-reduce per bucket and iteration; in the detailed model a ring's
        ``2 (p - 1)`` steps of every rank, moving twice the gradients per rank."""
        p, its = work.gpus, work.iterations
        pbytes = sum(work.param_bytes)
        o = work.options
        buckets = len(ddp_bucket_layout(work.param_bytes, o.bucket_bytes, o.first_bucket_bytes))
        if not work.detailed:
            return SchemeWork(messages=its * buckets)
        return SchemeWork(
            messages=its * buckets * 2 * max(0, p - 1) * p, moved_bytes=its * 2.0 * pbytes * p
        )

    def start(self) -> None:
        ctx = self.ctx
        trace = ctx.trace
        opts: DPOptions = self.options
        self.buckets = ddp_buckets(trace, opts.bucket_bytes, opts.first_bucket_bytes)
        self.bucket_bytes = [sum(trace.layers[i].param_bytes for i in b) for b in self.buckets]
        last_of_bucket = {min(b): k for k, b in enumerate(self.buckets)} if opts.overlap else {}
        self.ops = LayerOps(trace)
        self.bucket_after = last_of_bucket.get
        # Buckets whose last gradient comes from a layer that does not run (or all, when
        # not overlapping) become ready when backward ends.
        ran = {i for _d, _n, i in self.ops.fwd}
        self.at_end = [
            k for k, b in enumerate(self.buckets) if not opts.overlap or min(b) not in ran
        ]
        p = ctx.num_ranks
        n_it = ctx.iterations
        nb = len(self.buckets)
        self.ready = [[0] * nb for _ in range(n_it)]
        self.next_bucket = [0] * n_it
        self.inflight = [0] * n_it
        self.finished = [0] * n_it
        self.collective_threads = ctx.transport.collective_threads
        """Buckets reduced at once: one stream on GPUs; gloo's worker threads on CPUs."""
        self.reduced: list[Event] = [ctx.env.event() for _ in range(n_it)]
        self.ranks = list(ctx.topology.ring_order)
        self.num_ranks = p
        self.param_bytes = trace.param_bytes
        host = ctx.topology.host_spec
        copy_s_per_byte = (
            1.0 / ctx.topology.gpu_spec.memory_bandwidth_bytes_per_s if host is not None else 0.0
        )
        # DDP's own work on a CPU rank: each gradient is copied into its bucket as it is
        # ready, and once reduced the buckets are divided by the world size and copied
        # back into the gradients (two more passes), all on the rank's thread.
        self.copy_in_s = [nb * copy_s_per_byte for nb in self.bucket_bytes]
        self.unpack_s = 2 * self.param_bytes * copy_s_per_byte if p > 1 else 0.0
        self.update_s = ctx.update_s(self.param_bytes)
        for r in range(p):
            mem = ctx.gpus[r].memory
            mem.alloc("weights", self.param_bytes)
            mem.alloc("gradients", self.param_bytes)
            mem.alloc("optimizer", ctx.optimizer_state_bytes(self.param_bytes))
            if p > 1:
                mem.alloc("buffers", self.param_bytes)
            ctx.env.process(self._worker(r))

    def _worker(self, rank: int) -> Any:
        ctx = self.ctx
        gpu = ctx.gpus[rank]
        mem = gpu.memory
        activations = ctx.trace.activation_bytes
        ops = self.ops
        no_wait = self._no_wait
        ends_bucket = self._ends_bucket
        for it in range(ctx.iterations):
            # Forward, then backward in runs that end where a bucket fills up; nothing
            # waits in between, so all of it is queued now.
            for _layer, run in ops.forward_runs(it, no_wait):
                gpu.enqueue(run)
            mem.alloc("activations", activations)
            done = None
            for layer, run in ops.backward_runs(it, ends_bucket):
                b = self.bucket_after(layer) if layer >= 0 else None
                if b is not None and self.copy_in_s[b] > 0:
                    run.append((self.copy_in_s[b], BACKWARD, f"bucket{b} copy", it, -1, -1))
                done = gpu.compute_seq(run)
                if b is not None:
                    done.callbacks.append(self._ready_callback(it, b))
            if done is not None:
                yield done
            mem.free("activations", activations)
            for b in self.at_end:
                self._bucket_ready(it, b)
            if not self.buckets and not self.reduced[it].triggered:
                self.reduced[it].succeed()  # a model without parameters has nothing to reduce
            yield self.reduced[it]
            if self.unpack_s > 0:
                yield gpu.compute(self.unpack_s, BACKWARD, "bucket unpack", it)
            yield gpu.compute(self.update_s, UPDATE, "optimizer step", it)
            ctx.mark_iteration(rank, it)

    @staticmethod
    def _no_wait(_layer: int) -> bool:
        return False

    def _ends_bucket(self, layer: int) -> bool:
        return self.bucket_after(layer) is not None

    def _ready_callback(self, it: int, b: int) -> Any:
        return lambda _ev: self._bucket_ready(it, b)

    def _bucket_ready(self, it: int, b: int) -> None:
        cnt = self.ready[it]
        cnt[b] += 1
        if cnt[b] == self.num_ranks:
            self._launch(it)

    def _launch(self, it: int) -> None:
        """Start the next buckets whose gradients every rank has, in bucket order, while
        fewer than ``collective_threads`` are in flight."""
        while (
            self.inflight[it] < self.collective_threads
            and self.next_bucket[it] < len(self.buckets)
            and self.ready[it][self.next_bucket[it]] >= self.num_ranks
        ):
            b = self.next_bucket[it]
            self.next_bucket[it] += 1
            self.inflight[it] += 1
            self.ctx.coll.allreduce(
                self.ranks,
                self.bucket_bytes[b],
                self.options.algorithm,
                self._done_callback(it),
                tag=f"bucket{b}",
                iteration=it,
            )

    def _done_callback(self, it: int) -> Any:
        def done(_t: float) -> None:
            self.inflight[it] -= 1
            self.finished[it] += 1
            if self.finished[it] == len(self.buckets):
                self.reduced[it].succeed()
            else:
                self._launch(it)

        return done
