"""How much slower is a training step whose caches went cold between its passes?

A rank that shares its core with other ranks, or a pipeline stage whose forward and
backward of one micro-batch are separated by other micro-batches and other stages, finds
its weights and activations evicted when it computes again. The one-rank profile that
``sim validate`` predicts from (``sim profile --in-runtime``) computes warm. This script
measures the difference on this machine: each round, one thread (``torch`` with one
intra-op thread) runs ``--steps`` training steps of a zoo model at each batch size in
three ways, interleaved so that the machine's drift hits all three alike:

* **warm**: forward and backward back to back, as a one-rank profile runs them;
* **cold before**: a buffer larger than the last-level cache is written before the
  forward (another rank ran on the core in between);
* **cold between**: the same before the forward and between the forward and the
  backward (a pipeline's micro-batch, or a rank preempted mid-iteration).

The eviction is outside the timed parts; times are the thread's CPU time. It prints each
way's median per batch and its ratio to warm, and the spread over the rounds::

    python bench/cold_compute.py [--models mlp_medium cnn_medium] [--batches 6 24]
        [--steps 20] [--rounds 3] [--evict-mb 64]

docs/prediction.md has what it found.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

WAYS = ("warm", "cold before", "cold between")


def step_times(model: object, inputs: tuple, way: str, steps: int, junk: object) -> list[float]:
    """CPU seconds of the forward plus backward of ``steps`` steps, evicting ``junk``'s
    worth of cache as ``way`` says (outside the timed parts)."""
    out_times = []
    for _ in range(steps):
        if way != "warm":
            junk.add_(1.0)  # type: ignore[attr-defined]
        c0 = time.thread_time()
        out = model(*inputs)  # type: ignore[operator]
        loss = out.float().sum()
        c1 = time.thread_time()
        if way == "cold between":
            junk.add_(1.0)  # type: ignore[attr-defined]
        c2 = time.thread_time()
        loss.backward()
        out_times.append(c1 - c0 + time.thread_time() - c2)
    return out_times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp_medium", "cnn_medium"])
    parser.add_argument("--batches", nargs="+", type=int, default=[6, 24])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--evict-mb", type=int, default=64)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1 or args.evict_mb < 1 or min(args.batches) < 1:
        parser.error("--steps, --rounds, --evict-mb and every batch must be at least 1")
    import torch

    from realrun import zoo

    torch.set_num_threads(1)
    junk = torch.zeros(args.evict_mb << 18)  # float32: 4 bytes each
    for name in args.models:
        model = zoo.build(name)
        for b in args.batches:
            inputs = zoo.example_inputs(name, b)
            step_times(model, inputs, "warm", 3, junk)  # warm-up
            medians: dict[str, list[float]] = {w: [] for w in WAYS}
            for _ in range(args.rounds):
                for way in WAYS:
                    ts = step_times(model, inputs, way, args.steps, junk)
                    medians[way].append(statistics.median(ts))
            warm = statistics.median(medians["warm"])
            cells = []
            for way in WAYS:
                m = statistics.median(medians[way])
                spread = (max(medians[way]) - min(medians[way])) / m
                cells.append(f"{way} {1e3 * m:7.2f} ms ({m / warm:.2f}x, spread {spread:.0%})")
            print(f"{name} b{b}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
