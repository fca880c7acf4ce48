"""How accurate are profiled traces? Measured on this machine's CPU, written up in
docs/traces.md.

For each model and batch size b:

* **sum vs whole step**: the sum of the isolated per-layer forward and backward times
  (``sim profile``'s trace) against a timed whole forward + backward step of the same
  model, batch and inputs (``realrun.profiler.time_training_step``);
* **batch rescaling**: the trace at b rescaled to 2b (``Trace.rescale_batch``) against a
  whole step measured at 2b.

One torch thread; times are the process's CPU time (see ``realrun.profiler``), and the
measurements are interleaved in rounds with the median error reported, because a shared
machine's load drifts.

``--calibrate`` also compares the analytic traces (V100-class, 15.7e12 FLOP/s at the
default efficiency, 900 GB/s) with PipeDream's measured V100 profiles of the same models.

    python bench/trace_accuracy.py                       # the default models
    python bench/trace_accuracy.py --models resnet18:8 snn:64 --calibrate
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT_MODELS = [
    "resnet18:8",
    "alexnet:16",
    "squeezenet1_0:8",
    "googlenet:8",
    "snn:128",
    "residual_lstm:8",
    "seq2seq:32",
    "transformer:2",
]
PIPEDREAM_MODELS = [
    "alexnet",
    "vgg16",
    "resnet18",
    "resnet50",
    "resnet101",
    "inception_v3",
    "densenet121",
    "squeezenet1_0",
]


def measure(name: str, batch: int, rounds: int, repeats: int) -> dict:
    """Isolated-sum and whole-step times of zoo model ``name`` at ``batch`` and 2x.

    Measurements are interleaved in ``rounds`` (profile, whole step at b, whole step at
    2b), and the errors are medians over the rounds: on a shared machine the load drifts,
    and each round compares numbers taken close together.
    """
    import torch

    from realrun import zoo
    from realrun.profiler import ProfileConfig, profile_model, time_training_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = zoo.build(name)
    inputs = {b: zoo.example_inputs(name, b) for b in (batch, 2 * batch)}
    traces, whole_b, whole_2b, profile_s = [], [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        traces.append(
            profile_model(name, ProfileConfig(batch_size=batch, threads=1, progress=False))
        )
        profile_s.append(time.perf_counter() - started)
        whole_b.append(time_training_step(model, inputs[batch], warmup=1, repeats=repeats))
        whole_2b.append(time_training_step(model, inputs[2 * batch], warmup=1, repeats=repeats))
    med = statistics.median
    sum_errors = [t.compute_s / w - 1 for t, w in zip(traces, whole_b)]
    rescale_errors = [
        t.rescale_batch(2 * batch).compute_s / w - 1 for t, w in zip(traces, whole_2b)
    ]
    return {
        "model": name,
        "batch_size": batch,
        "layers": len(traces[0].layers),
        "rounds": rounds,
        "forward_sum_s": med(t.forward_s for t in traces),
        "backward_sum_s": med(t.backward_s for t in traces),
        "layer_sum_s": med(t.compute_s for t in traces),
        "whole_step_s": med(whole_b),
        "sum_error": med(sum_errors),
        "sum_errors": sum_errors,
        "predicted_2b_s": med(t.rescale_batch(2 * batch).compute_s for t in traces),
        "whole_step_2b_s": med(whole_2b),
        "rescale_error": med(rescale_errors),
        "rescale_errors": rescale_errors,
        "profile_wall_s": med(profile_s),
    }


def calibrate() -> list[dict]:
    """Analytic (V100-class) traces against PipeDream's V100 profiles, same batch."""
    from realrun.options import DEFAULT_EFFICIENCY
    from realrun.profiler import ProfileConfig, profile_model
    from traces import load_builtin

    rows = []
    for name in PIPEDREAM_MODELS:
        measured = load_builtin(name)
        b = measured.meta.batch_size
        analytic = profile_model(
            name,
            ProfileConfig(
                batch_size=b,
                analytic=True,
                device_flops=15.7e12,
                efficiency=DEFAULT_EFFICIENCY,
                memory_bytes_per_s=900e9,
                progress=False,
            ),
        )
        flops = sum(x.flops or 0 for x in analytic.layers)
        rows.append(
            {
                "model": name,
                "batch_size": b,
                "pipedream_s": measured.compute_s,
                "analytic_s": analytic.compute_s,
                "ratio": analytic.compute_s / measured.compute_s,
                "achieved_tflops": 3 * flops / measured.compute_s / 1e12,
            }
        )
    return rows


def _spread(values: list[float]) -> str:
    """``+2.1% (-1.0% .. +4.0%)``: the median and range of per-round errors."""
    return f"{statistics.median(values):+.1%} ({min(values):+.1%} .. {max(values):+.1%})"


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(format(r[c[0]], c[2]) for c in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def main(argv: list[str] | None = None) -> int:
    """Run the measurements and print Markdown tables (and JSON with --json)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=DEFAULT_MODELS, metavar="NAME:BATCH")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of profile + whole steps (median error)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="whole-step samples per round (median)")
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="also compare analytic traces with PipeDream's V100 profiles",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    rows = []
    load_before = os.getloadavg()[0]
    for spec in args.models:
        name, _, batch = spec.partition(":")
        rows.append(measure(name, int(batch or 8), args.rounds, args.repeats))
        r = rows[-1]
        print(
            f"{name}: sum {r['sum_error']:+.1%}, rescale {r['rescale_error']:+.1%}",
            file=sys.stderr,
            flush=True,
        )
    for r in rows:
        r["sum_error_text"] = _spread(r["sum_errors"])
        r["rescale_error_text"] = _spread(r["rescale_errors"])
    print(
        _table(
            rows,
            [
                ("model", "model", "s"),
                ("batch_size", "b", "d"),
                ("layers", "layers", "d"),
                ("forward_sum_s", "fwd sum (s)", ".3f"),
                ("backward_sum_s", "bwd sum (s)", ".3f"),
                ("layer_sum_s", "layer sum (s)", ".3f"),
                ("whole_step_s", "whole step (s)", ".3f"),
                ("sum_error_text", "sum error: median (range)", "s"),
                ("predicted_2b_s", "2b predicted (s)", ".3f"),
                ("whole_step_2b_s", "2b measured (s)", ".3f"),
                ("rescale_error_text", "2b error: median (range)", "s"),
            ],
        )
    )
    load_after = os.getloadavg()[0]
    print(
        f"\n1-minute load average: {load_before:.1f} before, {load_after:.1f} after "
        f"({os.cpu_count()} CPUs)"
    )
    out = {"rows": rows, "load_before": load_before, "load_after": load_after}
    if args.calibrate:
        cal = calibrate()
        out["calibration"] = cal
        print()
        print(
            _table(
                cal,
                [
                    ("model", "model", "s"),
                    ("batch_size", "b", "d"),
                    ("pipedream_s", "PipeDream V100 (s)", ".3f"),
                    ("analytic_s", "analytic (s)", ".3f"),
                    ("ratio", "analytic / measured", ".2f"),
                    ("achieved_tflops", "measured TFLOP/s (3x fwd FLOPs)", ".1f"),
                ],
            )
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
