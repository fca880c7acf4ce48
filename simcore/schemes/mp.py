"""``mp``: naive model parallelism (docs/schemes.md, section 5).

The layers are split into one stage per GPU (``scheme.partition`` picks how); one
mini-batch at a time goes forward through all stages and backward back, so only one GPU
works at any moment (utilisation ``1/N`` for equal stages). Activations and their
gradients cross stage boundaries over the topology's links; each stage updates its
weights after its backward. Runs on the shared pipeline runner
(:mod:`simcore.schemes._pipeline`) with the GPipe schedule of one micro-batch.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from simcore.schedule import Schedule, gpipe
from simcore.schemes._pipeline import PipelineFeatures, PipelineScheme


class ModelParallel(PipelineScheme):
    """Naive model parallelism (see module docs)."""

    name = "mp"
    summary = "model parallelism: layers split over the GPUs, one batch at a time"
    features = PipelineFeatures(microbatches=1)
    convergence_variants = MappingProxyType({"mp": {}})

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        return gpipe(stages, 1, iterations, name="mp")
