"""``interleaved``: interleaved 1F1B, Megatron-LM's virtual stages (docs/pipelines.md).

The model is cut into ``v x N`` stages (``chunks`` = ``v``), stage ``s`` on GPU ``s mod N``.
Micro-batches go through a GPU's chunks in rounds of ``N`` (depth first) and the
schedule is 1F1B's with a flush per iteration, as torch's ``ScheduleInterleaved1F1B``
orders it. Each chunk is ``1/v`` of a 1F1B stage, so the fill and drain shrink by ``v``:
the bubble is ``(N-1)/(v M)`` of the ideal time instead of 1F1B's ``(N-1)/M``, for ``v``
times the point-to-point messages. ``M`` must split into equal rounds
(``M / max(1, M // N)`` whole). Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import PipelineFeatures
from simcore.schemes._virtual import ChunkOptions, VirtualPipeline


class Interleaved(VirtualPipeline):
    """Interleaved 1F1B (see module docs)."""

    name = "interleaved"
    summary = "interleaved 1F1B: several virtual stages per GPU, depth first (Megatron)"
    Options = ChunkOptions
    features = PipelineFeatures(chunks=2, microbatches_per_stage=4)
