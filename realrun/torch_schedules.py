"""torch's own pipeline schedule generators under our scheme names, for checking ours
(``sim schedule --compare-torch``, ``tests/test_pipeline_schedules.py``).

``torch.distributed.pipelining``'s multi-stage schedule classes lay out their action
lists for every rank when they are built and read nothing of their stages then but the
counts (stages, ranks), so stand-ins for the stages are enough to get the lists without a
process group: :func:`torch_order` builds the class and returns its ``pipeline_order``.
"""

from __future__ import annotations

from types import SimpleNamespace

TORCH_CLASSES = {
    "interleaved": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "zb-interleaved": "ScheduleInterleavedZeroBubble",
    "zb-h1": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
"""torch's schedule class of each scheme (``zb-h1``: its zero bubble on one stage per
rank, which orders passes as the paper's ZB-H1)."""


def torch_order(scheme: str, ranks: int, chunks: int, microbatches: int) -> list[list[str]]:
    """The passes torch's generator gives each rank, as action strings (an
    ``OVERLAP_F_B`` as its two passes, idle slots left out). Raises ``KeyError`` for a
    scheme torch has no class for and whatever torch raises for a shape it refuses."""
    from torch.distributed.pipelining import schedules

    cls = getattr(schedules, TORCH_CLASSES[scheme])
    stages = [
        SimpleNamespace(
            num_stages=ranks * chunks, group_size=ranks, group_rank=0, stage_index=i, submod=None
        )
        for i in range(chunks)
    ]
    sched = cls(stages, microbatches, loss_fn=lambda out, target: out)
    out = []
    for r in range(ranks):
        row: list[str] = []
        for a in sched.pipeline_order[r]:
            if a is not None:
                row += [str(x) for x in a.sub_actions] if a.sub_actions else [str(a)]
        out.append(row)
    return out
