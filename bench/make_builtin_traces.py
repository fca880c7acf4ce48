"""Regenerate the built-in traces of zoo models (traces/builtin/zoo/ and index.json).

    python bench/make_builtin_traces.py                  # CPU-profiled + analytic traces
    python bench/make_builtin_traces.py --only snn-cpu   # just one
    python bench/make_builtin_traces.py --device cuda    # also GPU-profiled seed models

Built-in names: ``<model>-cpu`` (measured on this machine's CPU, 1 thread),
``<model>-analytic`` (FLOP-based estimates for a V100-class GPU: 15.7e12 FP32 FLOP/s at
the default efficiency, 900 GB/s memory floor) and, with ``--device cuda``,
``<model>-gpu`` (measured on the GPU at hand). Each entry of index.json records the
device, torch version, batch size, date and method.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

from realrun.options import DEFAULT_EFFICIENCY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILTIN = os.path.join(ROOT, "traces", "builtin")
V100_FLOPS = 15.7e12
V100_MEMORY_BYTES_PER_S = 900e9


@dataclass(frozen=True)
class Target:
    """One built-in trace to make: its name, zoo model, batch size and method."""

    name: str
    model: str
    batch_size: int
    method: str  # "cpu", "analytic" or "gpu"


CPU_TARGETS = [
    ("resnet18", 8),
    ("alexnet", 16),
    ("squeezenet1_0", 8),
    ("snn", 128),
    ("residual_lstm", 8),
    ("transformer", 2),
    ("seq2seq", 32),
    ("googlenet", 8),
]
SEED_TARGETS = [
    ("vgg16", 64),
    ("resnet50", 128),
    ("resnet152", 64),
    ("inception_v3", 64),
    ("transformer", 32),
    ("residual_lstm", 64),
    ("snn", 256),
]


def targets(with_gpu: bool) -> list[Target]:
    """Every built-in trace this script makes."""
    out = [Target(f"{m}-cpu", m, b, "cpu") for m, b in CPU_TARGETS]
    out += [Target(f"{m}-analytic", m, b, "analytic") for m, b in SEED_TARGETS]
    if with_gpu:
        out += [Target(f"{m}-gpu", m, b, "gpu") for m, b in SEED_TARGETS]
    return out


def make(target: Target) -> dict:
    """Profile one target, write its trace file and return its index.json entry."""
    from realrun.profiler import ProfileConfig, profile_model
    from realrun.zoo import get
    from traces import save_trace

    if target.method == "analytic":
        config = ProfileConfig(
            batch_size=target.batch_size,
            analytic=True,
            device_flops=V100_FLOPS,
            efficiency=DEFAULT_EFFICIENCY,
            memory_bytes_per_s=V100_MEMORY_BYTES_PER_S,
            progress=False,
        )
    else:
        config = ProfileConfig(
            batch_size=target.batch_size,
            device="cuda" if target.method == "gpu" else "cpu",
            threads=1,
            progress=False,
        )
    trace = profile_model(target.model, config)
    rel = f"zoo/{target.name}.json"
    save_trace(trace, os.path.join(BUILTIN, rel))
    m = trace.meta
    kind = {
        "cpu": "CPU-profiled",
        "gpu": "GPU-profiled",
        "analytic": "ANALYTIC (not measured), V100-class",
    }[target.method]
    return {
        "file": rel,
        "format": "dtsim",
        "description": f"{get(target.model).description}; {kind}, batch {m.batch_size}",
        "device": _table_device(m.device) if target.method == "gpu" else m.device,
        "framework": m.framework,
        "batch_size": m.batch_size,
        "provenance": (
            f"{m.provenance}. Made {m.date} with {m.framework} by "
            f"'python bench/make_builtin_traces.py --only {target.name}'."
        ),
    }


def _table_device(name: str) -> str:
    """The GPU table's key (V100, A100, H100...) contained in a CUDA device name, so that
    the simulator can rescale the trace to other GPUs; else the name itself."""
    import yaml

    with open(os.path.join(ROOT, "simcore", "presets", "gpus.yaml"), encoding="utf-8") as fh:
        keys = yaml.safe_load(fh)
    return next((k for k in keys if k in name), name)


def main(argv: list[str] | None = None) -> int:
    """Make the requested built-in traces and merge them into index.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only",
        nargs="*",
        default=None,
        metavar="NAME",
        help="built-in names to make (default: all)",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: also profile the seed models on the GPU",
    )
    args = ap.parse_args(argv)
    todo = targets(args.device == "cuda")
    if args.only:
        known = {t.name for t in todo}
        bad = [n for n in args.only if n not in known]
        if bad:
            ap.error(f"unknown built-in {bad[0]!r}; choose from: {', '.join(sorted(known))}")
        todo = [t for t in todo if t.name in args.only]
    index_path = os.path.join(BUILTIN, "index.json")
    for t in todo:
        started = time.perf_counter()
        entry = make(t)
        with open(index_path, encoding="utf-8") as fh:
            index = json.load(fh)
        index["models"][t.name] = entry
        tmp = index_path + f".tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(index, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        os.replace(tmp, index_path)
        print(f"{t.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
