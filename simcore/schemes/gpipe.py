"""``gpipe``: synchronous micro-batch pipeline (docs/schemes.md, section 6).

The mini-batch (``batch_size``) is split into ``M`` micro-batches; all of them go
forward through the stages, then all backward; each stage applies its accumulated
gradients once per mini-batch (a flush). For ``N`` equal stages the step takes
``(M + N - 1)(t_f + t_b)`` and the bubble is ``(N - 1)/(M + N - 1)``. With
``recompute`` each stage keeps only its input activations per micro-batch and re-runs
its forward right before each backward (more compute, less memory). Stages are one GPU
each; ``scheme.partition`` picks how they are cut (the seed paper feeds GPipe with the
antichain partitioner). Automatic ``M``: four per stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from simcore.config import option
from simcore.schedule import Schedule, gpipe
from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures, PipelineScheme


@dataclass(frozen=True)
class GPipeOptions(MicrobatchOptions):
    """Options of ``gpipe``."""

    recompute: bool = option(
        False,
        "re-materialisation: keep only stage inputs, recompute the forward before each backward",
    )


class GPipe(PipelineScheme):
    """GPipe (see module docs)."""

    name = "gpipe"
    summary = "synchronous micro-batch pipeline with a flush per mini-batch (GPipe)"
    Options = GPipeOptions
    features = PipelineFeatures(microbatches_per_stage=4)
    convergence_variants = MappingProxyType({"gpipe": {}})

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        return gpipe(stages, microbatches, iterations, recompute=options.recompute)
