"""One rank of torch.distributed.pipelining's schedule for the job's scheme (GPipe,
Schedule1F1B, for ``zb-h1`` ScheduleInterleavedZeroBubble on one stage per rank, and the
multi-stage classes of the virtual-stage schemes) on the stages of
:func:`realrun.stages.split_model` (run by tests/test_real_pipeline.py, one process per
rank, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set; a rank builds a PipelineStage for
every stage our schedule places on it): one mini-batch, then an SGD step with the job's
learning rate; writes the rank's weights and, on the rank of the last stage, the
micro-batches' losses to ``OUT/torchpp-rank<r>.pt``."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)

from realrun import zoo
from realrun.job import Job
from realrun.pipeline import make_schedule, microbatch
from realrun.runtime import build_model, loss_of
from realrun.stages import split_model


class OwnParameters(torch.nn.Module):
    """A stage as torch's PipelineStage expects one: a module whose ``parameters()`` are
    the stage's own. A :class:`realrun.stages.StageModule` holds the whole model's graph
    module, so with two stages on a rank each stage's gradient scaling (and its weight
    pass) would also reach the other's parameters."""

    def __init__(self, stage: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "stage", stage)  # not registered: its parameters are not ours
        self.own = torch.nn.ParameterList(stage.stage_parameters())

    def forward(self, *x: torch.Tensor) -> object:
        return self.stage(*x)


def main(job_path: str, out: str) -> None:
    job = Job.read(job_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    setup = build_model(job, torch.device("cpu"))
    m = job.pipeline["microbatches"]
    split = split_model(
        setup.model,
        job.pipeline["stage_layers"],
        zoo.example_inputs(job.model, job.batch_size // m, "meta"),
    )
    ours = make_schedule(job.scheme, job.options, job.pipeline["replicas"], m, 1)
    local = ours.local_stages()[rank]
    n = len(split.stages)
    pstages = [
        PipelineStage(
            OwnParameters(split.stages[s]),
            s,
            n,
            torch.device("cpu"),
            input_args=tuple(torch.zeros(c.shape, dtype=c.dtype) for c in split.stages[s].inputs),
        )
        for s in local
    ]
    single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    multi = {
        "zb-h1": ScheduleInterleavedZeroBubble,
        "interleaved": ScheduleInterleaved1F1B,
        "looped-bfs": ScheduleLoopedBFS,
        "zb-interleaved": ScheduleInterleavedZeroBubble,
        "zbv": ScheduleZBVZeroBubble,
        "dualpipev": ScheduleDualPipeV,
    }
    if job.scheme in single:
        sched = single[job.scheme](pstages[0], m, loss_fn=loss_of)
    else:
        sched = multi[job.scheme](pstages, m, loss_fn=loss_of)
    cache: dict[int, object] = {}
    parts = [microbatch(job, j, m, cache) for j in range(m)]
    inputs = tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(parts[0][0])))
    labels = torch.cat([p[1] for p in parts])
    losses: list[torch.Tensor] = []
    args = inputs if 0 in local else ()
    kwargs = {"target": labels, "losses": losses} if n - 1 in local else {}
    sched.step(*args, **kwargs)
    params = [
        (nm, p)
        for s in local
        for nm, p in zip(split.stages[s].param_names, split.stages[s].stage_parameters())
    ]
    with torch.no_grad():
        for _nm, p in params:
            if p.grad is not None:
                p -= job.lr * p.grad
    torch.save(
        {
            "weights": {nm: p.detach().clone() for nm, p in params},
            "losses": [float(x) for x in losses],
        },
        os.path.join(out, f"torchpp-rank{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
