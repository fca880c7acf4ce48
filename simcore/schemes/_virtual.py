"""The base of today's pipeline schemes (``interleaved``, ``looped-bfs``,
``zb-interleaved``, ``zb-h1``, ``zbv``, ``dualpipev``): flushed every iteration, one GPU
per stage or several virtual stages per GPU, schedules from
:mod:`simcore.pipeline_schedules` run by the shared pipeline runner
(:mod:`simcore.schemes._pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simcore import pipeline_schedules as ps
from simcore.config import option
from simcore.schedule import Schedule, ScheduleError
from simcore.schemes._pipeline import MicrobatchOptions, PipelineScheme


@dataclass(frozen=True)
class ChunkOptions(MicrobatchOptions):
    """Options of the schemes that take a number of virtual stages per GPU."""

    chunks: int = option(
        2,
        "stages (model chunks) per GPU, placed in a loop: stage s runs on GPU s mod N; "
        "the model is cut into chunks x GPUs stages",
        minimum=1,
    )


class VirtualPipeline(PipelineScheme):
    """A flushed pipeline scheme whose schedule :func:`simcore.pipeline_schedules.make`
    generates under the scheme's name (see module docs)."""

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        ranks = 1 + max(r for st in stages for r in st)
        chunks = len(stages) // ranks
        schedule = ps.make(cls.name, ranks, chunks, microbatches, iterations)
        if schedule.stages != tuple(tuple(st) for st in stages):
            raise ScheduleError(
                f"{cls.name} places its {len(stages)} stages as {list(schedule.stages)}, "
                f"not {list(stages)}"
            )
        return schedule
