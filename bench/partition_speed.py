"""Benchmark the antichain partitioner on the antichain paper's ten models.

For each model, on 4 and 8 GPUs, straight and with replicated stages, times
``simcore.partition.partition`` (graph preparation, antichain states, dynamic programme;
not reading the profile) over ``--repeats`` runs in this process and prints the median
and best wall time next to the paper's Table 1 time where docs/schemes.md, section 9 gives it
(VGG-16, ResNet-50, ResNet-101, Inception-v3, DenseNet-121). Inception-v3 is the raw
326-node graph (221,564 states), on which PipeDream's own optimizer runs out of memory.

Profiles: the built-in copies of PipeDream's measured profiles
(``traces/builtin/pipedream/``). Usage::

    python bench/partition_speed.py [--repeats 5] [--models vgg16,resnet50] [--gpus 4 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from analysis.report import PAPER_MODELS
from simcore.partition import partition
from traces import load_builtin

MODELS = PAPER_MODELS
"""The antichain paper's ten models (the report's list)."""

TABLE1_S = {
    ("vgg16", 4): 0.01,
    ("vgg16", 8): 0.03,
    ("resnet50", 4): 0.38,
    ("resnet50", 8): 1.17,
    ("resnet101", 4): 1.20,
    ("resnet101", 8): 3.69,
    ("inception_v3", 4): 3.07,
    ("inception_v3", 8): 4.12,
    ("densenet121", 4): 1.29,
    ("densenet121", 8): 3.73,
}
"""The paper's partitioner run times (seconds) quoted in docs/schemes.md, section 9."""

BANDWIDTH = 1.25e9  # 10 Gbps, PipeDream's optimizer's usual setting


def load(model: str):
    """The measured profile of ``model`` (the built-in copy)."""
    return load_builtin(model), "builtin"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--gpus", type=int, nargs="+", default=[4, 8])
    args = ap.parse_args(argv)
    print(
        f"{'model':<14}{'source':<8}{'gpus':>5} {'mode':<11}{'states':>9}{'median':>10}"
        f"{'best':>10}{'Table 1':>9}  bottleneck"
    )
    slower = []
    for model in args.models.split(","):
        trace, source = load(model)
        for gpus in args.gpus:
            for straight in (True, False):
                times, p = [], None
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    p = partition(trace, gpus, BANDWIDTH, straight=straight)
                    times.append(time.perf_counter() - t)
                assert p is not None
                med, best = statistics.median(times), min(times)
                ref = TABLE1_S.get((model, gpus))
                mark = f"{ref:>8.2f}s" if ref is not None else f"{'-':>9}"
                if ref is not None and med >= ref:
                    slower.append((model, gpus, straight))
                mode = "straight" if straight else "replicated"
                print(
                    f"{model:<14}{source:<8}{gpus:>5} {mode:<11}{p.states:>9,}"
                    f"{med * 1e3:>8.1f}ms{best * 1e3:>8.1f}ms{mark}  "
                    f"{p.bottleneck_s * 1e3:.3f} ms {list(p.replicas)}"
                )
    if slower:
        print(f"slower than Table 1: {slower}")
        return 1
    print("every partitioning with a Table 1 time is faster than it (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
