"""``looped-bfs``: breadth-first pipeline over virtual stages (arXiv 2211.05953; docs/pipelines.md).

Looped placement as ``interleaved`` (``chunks`` stages per GPU, stage ``s`` on GPU
``s mod N``), but a GPU runs every micro-batch's forward on its first chunk, then on the
next, and the backwards from the last chunk back (torch's ``ScheduleLoopedBFS``):
GPipe's order on each chunk, so the activations of all ``M`` micro-batches of every chunk
are held at once. Automatic ``M``: four per GPU.
"""

from __future__ import annotations

from simcore.schemes._pipeline import PipelineFeatures
from simcore.schemes._virtual import ChunkOptions, VirtualPipeline


class LoopedBFS(VirtualPipeline):
    """Looped BFS (see module docs)."""

    name = "looped-bfs"
    summary = "looped BFS: virtual stages per GPU, breadth first (all micro-batches per chunk)"
    Options = ChunkOptions
    features = PipelineFeatures(chunks=2, microbatches_per_stage=4)
