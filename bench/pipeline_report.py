"""Report: the pipeline schemes against data parallelism, and GPipe's speedups next to the
antichain paper's.

1. On 4 GPUs of one PCIe box (``--topology pcie``), the simulated throughput of ``dp``,
   ``mp``, ``gpipe``, ``pipedream`` and ``spectrain`` for a convolutional model (VGG-16),
   a fully-connected-heavy one (AlexNet) and a recurrent one (GNMT, our Sockeye
   stand-in), each at its trace's batch size (per GPU for ``dp``, per pipeline for the
   others), with every scheme's default options.
2. GPipe with the antichain partition on 4 and 8 GPUs: the simulated speedup over one GPU
   at the same batch, for the antichain paper's ten models, with the automatic
   micro-batch count (``M = 4N``) and with ``M = 16N`` (at most the batch size), next to
   the paper's 3.4 and 3.76; and the partitioner's own prediction (one GPU against its
   bottleneck stage, with activation transfers at PCIe's 12 GB/s; no bubble).

Usage::

    python bench/pipeline_report.py [--iterations 4] [--models vgg16,alexnet,gnmt]
"""

from __future__ import annotations

import argparse
import time

from analysis.report import PAPER_MODELS
from dtsim.resolve import build_config
from dtsim.spec import RunSpec
from simcore import simulate
from simcore.partition import partition

SCHEMES = ("dp", "mp", "gpipe", "pipedream", "spectrain")
PAPER = {4: 3.4, 8: 3.76}
"""GPipe speedups with the antichain partition reported by the seed paper (CIFAR-10)."""


def run(spec: RunSpec):
    return simulate(build_config(spec, record_spans=False))


def throughput_table(models: list[str], iterations: int) -> None:
    print(
        "Throughput on 4 GPUs, pcie (samples/s; speedup over 1 GPU at the same global "
        "batch in brackets)"
    )
    print(f"{'model':<10}" + "".join(f"{s:>20}" for s in SCHEMES))
    for model in models:
        cells = []
        for scheme in SCHEMES:
            r = run(
                RunSpec(scheme=scheme, gpus=4, model=model, topology="pcie", iterations=iterations)
            )
            cells.append(f"{r.throughput_samples_s:>10.1f} ({r.speedup:4.2f}x)")
        print(f"{model:<10}" + "".join(f"{c:>20}" for c in cells))
    print()


def gpipe_table(models: list[str], iterations: int) -> None:
    print("GPipe with the antichain partition, pcie: speedup over 1 GPU at the same batch")
    print(
        f"{'model':<14}{'gpus':>5}{'M=4N':>9}{'bubble':>8}{'M':>5}{'M=16N':>8}{'bubble':>8}"
        f"{'partitioner':>12}{'paper':>7}"
    )
    for model in models:
        for gpus in (4, 8):
            spec = RunSpec(
                scheme="gpipe", gpus=gpus, model=model, topology="pcie", iterations=iterations
            )
            auto = run(spec)
            cfg = build_config(spec)
            m = min(16 * gpus, cfg.effective_batch_size)
            many = run(spec.replace(**{"scheme.microbatches": m}))
            p = partition(cfg.trace, gpus, 12e9, straight=True, activation_term=True)
            print(
                f"{model:<14}{gpus:>5}{auto.speedup:>8.2f}x{auto.bubble_fraction:>8.0%}"
                f"{m:>5}{many.speedup:>7.2f}x{many.bubble_fraction:>8.0%}"
                f"{p.speedup_vs_1gpu:>11.2f}x{PAPER[gpus]:>7.2f}"
            )
    print()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--models", default="vgg16,alexnet,gnmt", help="models of the throughput table")
    ap.add_argument(
        "--gpipe-models", default=",".join(PAPER_MODELS), help="models of the GPipe speedup table"
    )
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    throughput_table(args.models.split(","), args.iterations)
    gpipe_table(args.gpipe_models.split(","), args.iterations)
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
