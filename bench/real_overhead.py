"""What ``sim real``'s recording costs: its iteration time against the plain training loop
it stands for, run back to back on this machine.

``sim real`` records every layer's span, hooks every gradient bucket, writes heartbeats
and runs messenger threads; a validation compares the simulator with those runs, so what
they add to a user's own loop is an error the comparison cannot see. For each round this
script runs, one after the other on loopback:

* **plain**: the loop a user writes, on the job ``sim real --write-job`` makes for the same
  settings (same model, batch, optimizer, seed): ``dp`` as
  ``DistributedDataParallel`` with its default buckets, ``gpipe`` as
  ``torch.distributed.pipelining.ScheduleGPipe`` on the same stages
  (:func:`realrun.stages.split_model` of the job's plan); rank 0's mean iteration time
  after the warm-up;
* **sim real**: ``sim real --json`` of the same settings, its ``iteration_time_s``.

It prints each round's pair, the median of each side, their ratio (sim real / plain) and
the median of the per-round ratios, with the spread (max - min over median) of each side:
the machine's drift between back-to-back runs is of the same order, so read a ratio
against the spreads. Usage::

    python bench/real_overhead.py [--scheme dp|gpipe] [--model mlp_medium] [--gpus 2]
        [--batch-size 24] [--iterations 20] [--rounds 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sim() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "sim")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "dtsim.cli"]


def _settings(args: argparse.Namespace) -> list[str]:
    flags = ["--scheme", args.scheme, "--model", args.model, "--gpus", str(args.gpus)]
    flags += ["--batch-size", str(args.batch_size), "--iterations", str(args.iterations)]
    flags += ["--backend", "gloo", "--set", f"warmup_iterations={args.warmup}"]
    if args.scheme == "gpipe":
        flags += ["--set", f"scheme.microbatches={args.microbatches}"]
    return flags


def sim_real(args: argparse.Namespace) -> float:
    """``sim real --json``'s iteration time for the settings."""
    out = subprocess.run(
        [*_sim(), "real", *_settings(args), "--json"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"sim real failed: {out.stderr.strip()[-500:]}")
    return float(json.loads(out.stdout)["iteration_time_s"])


def plain(args: argparse.Namespace, job_path: str) -> float:
    """The plain loop's iteration time on rank 0 (one process per rank, gloo on loopback)."""
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="dtsim-plain-") as tmp:
        procs = []
        for rank in range(args.gpus):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.gpus))
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            cmd = [sys.executable, __file__, "--worker", job_path, tmp]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"the plain loop failed: exit codes {codes}")
        with open(os.path.join(tmp, "rank0.json"), encoding="utf-8") as fh:
            return float(json.load(fh)["iteration_time_s"])


def worker(job_path: str, out: str) -> None:  # pragma: no cover - runs in rank processes
    """One rank of the plain loop (environment as torchrun gives it)."""
    import torch
    import torch.distributed as dist

    from realrun import zoo
    from realrun.job import Job
    from realrun.pipeline import microbatch
    from realrun.runtime import build_model, loss_of

    job = Job.read(job_path)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    setup = build_model(job, torch.device("cpu"))
    steps = job.warmup_iterations + job.iterations
    m = int(job.pipeline.get("microbatches", 1)) if job.pipeline else 1
    cache: dict[int, object] = {}
    batches = []
    for it in range(steps):  # the job's own data, made before the clock starts
        parts = [microbatch(job, it * m + j, m, cache) for j in range(m)]
        inputs = tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(parts[0][0])))
        batches.append((inputs, torch.cat([p[1] for p in parts])))
    if job.scheme == "dp":
        model = torch.nn.parallel.DistributedDataParallel(setup.model)
        params = list(model.parameters())

        def step(inputs: tuple, labels: torch.Tensor) -> None:
            loss_of(model(*inputs), labels).backward()

    else:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        from realrun.stages import split_model

        split = split_model(
            setup.model,
            job.pipeline["stage_layers"],
            zoo.example_inputs(job.model, job.batch_size // m, "meta"),
        )
        stage = split.stages[rank]
        example = tuple(torch.zeros(c.shape, dtype=c.dtype) for c in stage.inputs)
        pstage = PipelineStage(stage, rank, world, torch.device("cpu"), input_args=example)
        sched = ScheduleGPipe(pstage, m, loss_fn=loss_of)
        params = list(stage.stage_parameters())

        def step(inputs: tuple, labels: torch.Tensor) -> None:
            if rank == 0:
                sched.step(*inputs)
            elif rank == world - 1:
                sched.step(target=labels)
            else:
                sched.step()

    opt = torch.optim.SGD(params, lr=job.lr, momentum=job.momentum)
    started = 0.0
    for it, (inputs, labels) in enumerate(batches):
        if it == job.warmup_iterations:
            dist.barrier()
            started = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step(inputs, labels)
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - started
    if rank == 0:
        with open(os.path.join(out, "rank0.json"), "w", encoding="utf-8") as fh:
            json.dump({"iteration_time_s": elapsed / job.iterations}, fh)
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scheme", choices=("dp", "gpipe"), default="dp")
    ap.add_argument("--model", default="mlp_medium")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=24)
    ap.add_argument("--microbatches", type=int, default=4, help="gpipe only")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the rounds to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dtsim-overhead-") as tmp:
        job_path = os.path.join(tmp, "job.json")
        made = subprocess.run(
            [*_sim(), "real", *_settings(args), "--write-job", job_path],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise SystemExit(f"sim real --write-job failed: {made.stderr.strip()[-500:]}")
        rounds = []
        for k in range(args.rounds):
            p = plain(args, job_path)
            r = sim_real(args)
            rounds.append({"plain_s": p, "sim_real_s": r})
            print(f"round {k + 1}: plain {1e3 * p:8.2f} ms   sim real {1e3 * r:8.2f} ms   "
                  f"ratio {r / p:.3f}")  # fmt: skip
    ps = [x["plain_s"] for x in rounds]
    rs = [x["sim_real_s"] for x in rounds]

    def spread(xs: list[float]) -> float:
        return (max(xs) - min(xs)) / statistics.median(xs)

    ratio = statistics.median(rs) / statistics.median(ps)
    paired = statistics.median(r / p for r, p in zip(rs, ps, strict=True))
    print(f"{args.scheme} {args.model} x{args.gpus}, batch {args.batch_size}, "
          f"{args.iterations} iterations after {args.warmup}, {args.rounds} rounds")  # fmt: skip
    print(f"plain    median {1e3 * statistics.median(ps):.2f} ms (spread {spread(ps):.1%})")
    print(f"sim real median {1e3 * statistics.median(rs):.2f} ms (spread {spread(rs):.1%})")
    print(f"sim real / plain: {ratio:.3f} (medians), {paired:.3f} (median of the rounds' ratios)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"settings": vars(args), "rounds": rounds, "ratio": ratio}, fh, indent=1)


if __name__ == "__main__":
    main()
