"""``pipedream``: asynchronous 1F1B pipeline with weight stashing (docs/schemes.md, section 7).

Stage ``k`` runs ``N - k - 1`` warm-up forwards, then alternates one forward and one
backward, each backward followed by the stage's weight update; the pipeline is never
flushed. With ``stash`` (the default) a micro-batch's backward uses the weights its
forward used, so stage ``k`` keeps up to ``N - k`` weight versions (the memory model
counts the older ones under ``stash``); without it this is vanilla pipelined model
parallelism (stale, inconsistent weights; no extra memory). Unless ``straight``, the
partitioner may replicate stages (PipeDream's optimizer): replicas take micro-batches
round-robin and all-reduce their gradients each round.

An iteration is one mini-batch's worth of micro-batches (``M``, automatically one per
GPU rounded up to a multiple of every stage's replicas), so that throughput is
``batch_size`` over the steady-state iteration time, ``M`` times the slowest stage's
time per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from simcore.config import option
from simcore.schedule import Schedule, one_f_one_b
from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures, PipelineScheme


@dataclass(frozen=True)
class PipeDreamOptions(MicrobatchOptions):
    """Options of ``pipedream``."""

    stash: bool = option(True, "weight stashing (false: vanilla pipelining with stale weights)")
    straight: bool = option(False, "one GPU per stage (false: the optimizer may replicate stages)")


class PipeDream(PipelineScheme):
    """PipeDream (see module docs)."""

    name = "pipedream"
    summary = "asynchronous 1F1B pipeline with weight stashing and replicated stages"
    Options = PipeDreamOptions
    features = PipelineFeatures(straight=False, stash=True, flush=False, microbatches_per_gpu=1)
    same_numerics = False
    update_per_microbatch = True
    convergence_variants = MappingProxyType(
        {"pipedream": {"straight": True}, "vanilla": {"straight": True, "stash": False}}
    )

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        return one_f_one_b(stages, microbatches, iterations, stash=options.stash)
