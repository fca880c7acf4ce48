"""One rank of torch.distributed.pipelining's GPipe on the stages of
:func:`realrun.stages.split_model` (run by tests/test_real_pipeline.py, one process per
stage, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set): one mini-batch, then an SGD
step with the job's learning rate; writes the stage's weights and, on the last stage, the
micro-batches' losses to ``OUT/torchpp-rank<r>.pt``."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from realrun import zoo
from realrun.job import Job
from realrun.pipeline import microbatch
from realrun.runtime import build_model, loss_of
from realrun.stages import split_model


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
    stage = split.stages[rank]
    example = tuple(torch.zeros(c.shape, dtype=c.dtype) for c in stage.inputs)
    pstage = PipelineStage(stage, rank, world, torch.device("cpu"), input_args=example)
    sched = ScheduleGPipe(pstage, m, loss_fn=loss_of)
    cache: dict[int, object] = {}
    parts = [microbatch(job, j, m, cache) for j in range(m)]
    inputs = tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(parts[0][0])))
    labels = torch.cat([p[1] for p in parts])
    losses: list[torch.Tensor] = []
    if rank == 0:
        sched.step(*inputs)
    elif rank == world - 1:
        sched.step(target=labels, losses=losses)
    else:
        sched.step()
    with torch.no_grad():
        for p in stage.stage_parameters():
            if p.grad is not None:
                p -= job.lr * p.grad
    torch.save(
        {
            "weights": {
                n: p.detach().clone() for n, p in zip(stage.param_names, stage.stage_parameters())
            },
            "losses": [float(x) for x in losses],
        },
        os.path.join(out, f"torchpp-rank{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
