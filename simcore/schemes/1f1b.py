"""``1f1b``: synchronous 1F1B with a flush, PipeDream-Flush (docs/pipelines.md).

One stage per GPU. GPU ``r`` runs ``N - 1 - r`` forwards, then one forward and one
backward in turn, then the remaining backwards; the stages update once per iteration. It
takes as long as GPipe, ``(M + N - 1)(t_f + t_b)``, but holds at most ``N - r``
micro-batches' activations on GPU ``r`` instead of ``M``: the baseline the zero-bubble
paper compares ZB-H1 with (``zb-h1``). Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures
from simcore.schemes._virtual import VirtualPipeline


class OneFOneB(VirtualPipeline):
    """Synchronous 1F1B (see module docs)."""

    name = "1f1b"
    summary = "synchronous 1F1B with a flush (PipeDream-Flush): GPipe's time, N micro-batches held"
    Options = MicrobatchOptions
    features = PipelineFeatures(microbatches_per_stage=4)
