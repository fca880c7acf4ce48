"""Where does a prediction's miss come from? The inputs a replay takes from its run, one at a time.

A ``sim validate`` folder holds, per case, the prediction's inputs (the model's profile
and the case's preset: the calibration plus the profile's optimizer step) and, per kept
repeat, the replay's (the layer times the run measured and a preset with the knobs only
a run measures: the optimizer step, a server's handling per shard, the messaging CPU
under load, a pipeline's send holds). This simulates each case of the folder whose id
starts with the given prefix on the prediction's inputs with ONE of the replay's put in
(each knob alone, then the run's layer times alone, then all knobs, then everything: the
replay), all on the stages the run used, and prints the iteration times beside the
measured one, and how the run's layer times compare with the profile's at the same
(micro-)batch::

    python bench/prediction_gaps.py validation/ [PREFIX] [--repeat 0]

A knob that moves the prediction most of the way to the replay is the input the
prediction gets wrong; a miss the replay shares is the model's. Nothing is measured;
the simulations take seconds. docs/prediction.md has what it found.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

RUN_KNOBS = (
    ("gpu", "memory_bandwidth_bytes_per_s"),
    ("gpu", "step_overhead_s"),
    ("gpu", "predict_overhead_s"),
    ("host", "p2p_message_cpu_s"),
    ("host", "isend_s"),
    ("host", "posted_cpu_s"),
)
"""The preset settings a replay may take from its run
(``analysis.validation.inputs.case_topology``)."""


def profile_file(out_dir: str, case: Any) -> str:
    """The profile ``out_dir`` predicted ``case`` from: on the ranks a validation profiles
    on now, else on one rank (folders written before profiles ran on more)."""
    from analysis.validation.inputs import PROFILE_BATCHES, profile_ranks, trace_path

    path = trace_path(out_dir, case.model, PROFILE_BATCHES, case.input_shape, profile_ranks())
    if os.path.exists(path):
        return path
    return trace_path(out_dir, case.model, PROFILE_BATCHES, case.input_shape)


def gaps(out_dir: str, row: dict[str, Any], repeat: int = 0) -> list[tuple[str, float]]:
    """``[(what, iteration_time_s)]`` for the case of table ``row``: the prediction, each
    run knob that differs put in alone, the run's layer times alone, all the run's
    knobs on the profile, and the replay (repeat ``repeat``'s kept inputs)."""
    import tempfile

    import yaml

    from analysis.resolve import load_preset
    from analysis.validation.harness import sim_config
    from analysis.validation.inputs import case_preset_path
    from analysis.validation.matrix import case_from_row
    from analysis.validation.replay import measured_files, stages_path
    from simcore.engine import simulate
    from simcore.preset_keys import canonical
    from simcore.schemes import get_scheme

    case = case_from_row(row)
    profile = profile_file(out_dir, case)
    predicted_preset = case_preset_path(profile, str(row["calibration"]))
    run_trace, run_preset = measured_files(case, out_dir, repeat)
    if not (os.path.exists(profile) and os.path.exists(predicted_preset)):
        raise FileNotFoundError(f"no profile and preset of {case.model} in {out_dir}")
    if get_scheme(case.scheme).pipeline:
        with open(stages_path(run_trace)) as fh:
            case = replace(case, options=(*case.options, ("stages", fh.read().strip())))
    base = canonical(load_preset(predicted_preset))
    run = canonical(load_preset(run_preset))

    def simulate_on(preset: dict[str, Any], trace: str) -> float:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            yaml.safe_dump(preset, fh, sort_keys=False)
        try:
            config = sim_config(case, trace, fh.name, record_spans=False)
            return simulate(config).iteration_time_s
        finally:
            os.unlink(fh.name)

    out = [("prediction", simulate_on(base, profile))]
    for section, key in RUN_KNOBS:
        value = (run.get(section) or {}).get(key)
        if value is None or value == (base.get(section) or {}).get(key):
            continue
        one = {**base, section: {**dict(base.get(section) or {}), key: value}}
        if key == "p2p_message_cpu_s":  # the run's figure stands for every load
            one["host"]["p2p_message_busy_cpu_s"] = 0.0
        out.append((f"+ {section}.{key} = {value}", simulate_on(one, profile)))
    out.append(("+ the run's layer times", simulate_on(base, run_trace)))
    out.append(("+ all the run's knobs", simulate_on(run, profile)))
    out.append(("replay (all of the run's)", simulate_on(run, run_trace)))
    return out


def compute_ratio(out_dir: str, row: dict[str, Any], repeat: int = 0) -> tuple[float, float]:
    """``(run_s, profile_s)``: the forward and backward seconds of every layer once, at
    the batch the run measured (a pipeline's micro-batch), in the run's layer times
    (repeat ``repeat``) and in the profile's (rescaled to that batch)."""
    from analysis.validation.matrix import case_from_row
    from analysis.validation.replay import measured_files
    from traces.jsonfmt import load

    case = case_from_row(row)
    run = load(measured_files(case, out_dir, repeat)[0])
    profile = load(profile_file(out_dir, case))
    return run.compute_s, profile.rescale_batch(run.meta.batch_size).compute_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="a sim validate --out folder")
    parser.add_argument("prefix", nargs="?", default="", help="case ids starting with this")
    parser.add_argument("--repeat", type=int, default=0, help="the kept repeat to take")
    args = parser.parse_args(argv)
    table = os.path.join(args.out_dir, "validation.csv")
    if not os.path.exists(table):
        print(f"no validation.csv in {args.out_dir}", file=sys.stderr)
        return 2
    with open(table, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["point_id"].startswith(args.prefix)]
    if not rows:
        print(f"no case of {table} starts with {args.prefix!r}", file=sys.stderr)
        return 2
    for row in rows:
        measured = float(row["real_iteration_time_s"])
        print(f"{row['point_id']}: measured {1e3 * measured:.1f} ms")
        try:
            lines = gaps(args.out_dir, row, args.repeat)
        except FileNotFoundError as exc:
            print(f"  skipped: {exc}")
            continue
        for what, t in lines:
            print(f"  {1e3 * t:8.1f} ms {100 * (t - measured) / measured:+6.1f}%  {what}")
        run_s, profile_s = compute_ratio(args.out_dir, row, args.repeat)
        print(
            f"  the run's layers took {1e3 * run_s:.1f} ms a pass, the profile's "
            f"{1e3 * profile_s:.1f} ms ({run_s / profile_s:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
