"""One rank of a real run: ``python -m realrun --job JOB.json --out DIR``.

Reads its rank, the world size and the rendezvous address from the environment that
``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), so the same entry point runs under ``sim real``'s local spawner, inside
network namespaces, and under ``torchrun`` on several machines::

    sim real --scheme p3 --gpus 4 --model resnet18 --write-job job.json   # on one machine
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 \\
        -m realrun --job job.json --out results/                          # on each node

The world size must equal the job's workers plus servers. Rank 0 gathers every rank's
records and writes ``DIR/records.json``; ``sim real --from-records DIR/records.json``
prints and writes the result as a local run would.

What happens on a rank: the model is built with the job's seed (the same weights
everywhere), rank 0 profiles it if asked, everybody meets at a barrier that sets the
clocks' zero, the scheme runs (:mod:`realrun.schemes`), and the records are gathered.
``DIR/heartbeat`` (made by the spawner) gets the time of each rank's latest progress so the
spawner can tell a hung rank from ranks that wait for it.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from realrun.heartbeat import Heartbeat
from realrun.job import Job
from realrun.runtime import ModelSetup, Recorder, build_model


@dataclass
class RankContext:
    """What a scheme's rank needs.

    Attributes:
        job: the run.
        rank: this rank (workers first, then servers).
        rec: its recorder.
        setup: the model and its layers (servers use the initial values).
        group: a gloo process group over all ranks (point-to-point messages, barriers).
        heartbeat: progress reporting.
        extra: scheme-specific results added to this rank's record.
    """

    job: Job
    rank: int
    rec: Recorder
    setup: ModelSetup
    group: Any
    heartbeat: Heartbeat
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_worker(self) -> bool:
        """Whether this rank trains (rather than serves parameters)."""
        return self.rank < self.job.workers

    def beat(self, iteration: int, phase: int = 0) -> None:
        """Report progress and apply the job's fault hook (tests)."""
        self.heartbeat.beat(iteration, phase)
        if phase == 0:
            apply_fault(self.job.fault, self.rank, iteration)


def apply_fault(fault: str, rank: int, iteration: int) -> None:
    """The job's fault hook, for tests: ``WHAT:RANK:ITERATION`` makes ``RANK`` kill itself
    (``kill``), sleep for ever (``hang``) or stop itself with SIGSTOP (``stop``) when it
    starts ``ITERATION`` (-1: before meeting the other ranks)."""
    if not fault:
        return
    what, at_rank, it = fault.split(":")
    if int(at_rank) != rank or int(it) != iteration:
        return
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif what == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif what == "hang":
        while True:
            time.sleep(3600)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m realrun", description=__doc__.split("\n")[0])
    ap.add_argument("--job", required=True, help="job file written by sim real")
    ap.add_argument("--out", required=True, help="folder for records.json (rank 0)")
    return ap.parse_args(argv)


SWITCH_INTERVAL_S = 2e-4
"""How often the interpreter offers the GIL to another thread (Python's default: 5 ms)."""


def main(argv: list[str] | None = None) -> int:
    """Run one rank (see module docs); returns the exit code."""
    args = _parse(argv)
    # The spawner asks for every thread's stack with SIGUSR1 when the run stops moving,
    # to tell the rank that hung from those that wait for it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    job = Job.read(args.job)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != job.world_size:
        print(
            f"realrun: WORLD_SIZE is {world} but the job has {job.workers} workers and "
            f"{job.servers} servers ({job.world_size} ranks)",
            file=sys.stderr,
        )
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if job.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    # The rank's communication threads (realrun.runtime.Messenger) need the GIL to hand a
    # message to gloo; with Python's default 5 ms switch interval a message waits up to
    # that long behind the compute thread's Python code between two kernels.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    apply_fault(job.fault, rank, -1)
    timeout = datetime.timedelta(seconds=max(30.0, job.timeout_s * 4))
    dist.init_process_group(job.backend, rank=rank, world_size=world, timeout=timeout)
    group = (
        dist.new_group(backend="gloo", timeout=timeout)
        if job.backend != "gloo"
        else dist.group.WORLD
    )
    rec = Recorder(job.device_name(rank))
    setup = build_model(job, device)
    heartbeat = Heartbeat(os.path.join(args.out, "heartbeat"), rank)
    heartbeat.beat(-1)
    heartbeat.label("started")
    rec.on_span = heartbeat.label
    profile = None
    if job.profile and rank == 0:
        profile = _profile(job)
    ctx = RankContext(job, rank, rec, setup, group, heartbeat)
    from realrun.schemes import get_runtime

    scheme = get_runtime(job.scheme)(ctx)
    dist.barrier(group=group)
    rec.start_clock()
    scheme.run()
    heartbeat.beat(job.total_iterations)
    epoch_weights = ctx.extra.pop("epoch_weights", None)
    if job.save_weights and rank < job.workers:
        state = {k: v.detach().cpu() for k, v in setup.model.state_dict().items()}
        torch.save(state, os.path.join(args.out, f"weights-rank{rank}.pt"))
        if epoch_weights:
            torch.save(epoch_weights, os.path.join(args.out, f"epoch-weights-rank{rank}.pt"))
    rec.shift(_clock_offset_s(rec.t0, world, group))
    dist.barrier(group=group)
    record = rec.record(
        rank=rank,
        role=job.role(rank),
        host=job.host_of(rank),
        cuda_peak_bytes=(torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0),
        device_type=device.type,
        device_model=(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        **ctx.extra,
    )
    gathered: list[Any] = [None] * world if rank == 0 else []
    dist.gather_object(record, gathered if rank == 0 else None, dst=0, group=group)
    if rank == 0:
        out = {
            "job": job.to_dict(),
            "ranks": gathered,
            "profile": profile,
            "torch": torch.__version__,
        }
        os.makedirs(args.out, exist_ok=True)
        tmp = os.path.join(args.out, "records.json.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        os.replace(tmp, os.path.join(args.out, "records.json"))
    dist.barrier(group=group)
    return 0


def _boot_id() -> str:
    """The running kernel's boot id: processes that share it read one monotonic clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _clock_offset_s(zero: float, world: int, group: Any) -> float:
    """How much later this rank's zero (``zero``, monotonic seconds) is than the earliest
    rank's, when every rank reads the same monotonic clock; 0 otherwise."""
    mine = (_boot_id(), zero)
    zeros: list[Any] = [None] * world
    dist.all_gather_object(zeros, mine, group=group)
    boots = {b for b, _ in zeros}
    if len(boots) != 1 or "" in boots:
        return 0.0
    return zero - min(z for _, z in zeros)


def _profile(job: Job) -> dict[str, Any]:
    """Rank 0's layer profile of the job's model at its batch size, on this machine, as the
    project's trace JSON."""
    from realrun.profiler import ProfileConfig, profile_model
    from traces.jsonfmt import to_dict

    device = "cuda" if job.backend == "nccl" else "cpu"
    trace = profile_model(
        job.model,
        ProfileConfig(batch_size=job.batch_size, device=device, seed=job.seed, progress=False),
        job.input_shape,
    )
    return to_dict(trace)
