"""``zbv``: the zero-bubble paper's ZB-V (arXiv 2401.10241, section 6; docs/pipelines.md).

The model is cut into ``2N`` stages; GPU ``r`` runs stage ``r`` and stage ``2N-1-r`` (a V:
the forward goes down the GPUs and back up, the last GPU runs the middle two stages and
the first GPU the first and the last, so the loss is computed on GPU 0). Backwards are
split into ``I`` and ``W`` and ordered as torch's ``ScheduleZBVZeroBubble`` does; with
``T_F = T_I = T_W`` and ``M >= 2N - 1`` it has (almost) no bubble at 1F1B's activation
memory. Any ``M``. Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures
from simcore.schemes._virtual import VirtualPipeline


class ZBV(VirtualPipeline):
    """ZB-V (see module docs)."""

    name = "zbv"
    summary = (
        "zero bubble ZBV: two stages per GPU in a V, backward split, weight passes fill the bubble"
    )
    Options = MicrobatchOptions
    features = PipelineFeatures(chunks=2, placement="v", microbatches_per_stage=4)
