"""``dualpipev``: DeepSeek's DualPipe cut to a V (arXiv 2412.19437; docs/pipelines.md).

V placement as ``zbv`` (GPU ``r`` runs stages ``r`` and ``2N-1-r``). In the steady phase a
GPU pairs the forward of one chunk with the full backward of the other (overlapped
pairs in DeepSeek's kernels; here, as in torch's runtime, one after the other), and the
backwards of the last micro-batches are split (``I`` now, ``W`` queued) to fill the drain.
Needs ``M >= 2N`` micro-batches. Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures
from simcore.schemes._virtual import VirtualPipeline


class DualPipeV(VirtualPipeline):
    """DualPipeV (see module docs)."""

    name = "dualpipev"
    summary = "DualPipeV (DeepSeek): two stages per GPU in a V, forward and backward paired"
    Options = MicrobatchOptions
    features = PipelineFeatures(chunks=2, placement="v", microbatches_per_stage=4)
