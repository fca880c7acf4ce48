"""``zb-h1``: the zero-bubble paper's handcrafted ZB-H1 (docs/pipelines.md).

From arXiv 2401.10241, Figure 3 (top).

One stage per GPU. 1F1B with a flush, every backward split into ``I`` (input gradient,
on the critical path) and ``W`` (weight gradient, off it); GPU ``r`` delays its ``W``
passes by ``r`` micro-batches, so every GPU keeps at most ``N`` micro-batches' activations,
1F1B's peak on its first GPU, and the held-back ``W`` passes fill the drain. With
``T_F = T_I = T_W`` the bubble is ``(N-1)(T_F + T_I - T_W)``, a third of 1F1B's. Any ``M``.
Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures
from simcore.schemes._virtual import VirtualPipeline


class ZBH1(VirtualPipeline):
    """ZB-H1 (see module docs)."""

    name = "zb-h1"
    summary = (
        "zero bubble ZB-H1: 1F1B with the backward split, W passes fill the tail, 1F1B's memory"
    )
    Options = MicrobatchOptions
    features = PipelineFeatures(microbatches_per_stage=4)
