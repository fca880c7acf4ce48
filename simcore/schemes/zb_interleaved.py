"""``zb-interleaved``: the zero-bubble paper's ZB1P on interleaved stages (docs/pipelines.md).

From arXiv 2401.10241.

Interleaved 1F1B's order (torch's ``ScheduleInterleavedZeroBubble``) with every backward
split into ``I``, the gradient with respect to the stage's input (what the previous stage
waits for), and ``W``, the weight gradient, which waits: GPU ``r`` holds its weight passes
``r`` micro-batches back and runs the held ones at the end, where 1F1B idles. With
``chunks=1`` it is ZB-H1 (``zb-h1``). ``M`` must split into equal rounds as in
``interleaved``. Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import PipelineFeatures
from simcore.schemes._virtual import ChunkOptions, VirtualPipeline


class ZBInterleaved(VirtualPipeline):
    """Interleaved zero bubble (see module docs)."""

    name = "zb-interleaved"
    summary = "interleaved zero bubble (ZB1P): backward split into input and weight gradients"
    Options = ChunkOptions
    features = PipelineFeatures(chunks=2, microbatches_per_stage=4)
