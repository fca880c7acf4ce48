"""Re-simulate a finished validation with a setting changed, on the same real runs.

``sim validate`` simulates every real repeat on the compute it measured and keeps that
repeat's trace and preset in ``traces/measured/`` of its output (and a pipeline's stage
cuts beside them). This script simulates them all again, optionally with preset keys
overridden, and prints each case's measured time, the validation's prediction and the
new one: a what-if on the model of the emulated cluster that needs no new real run, so
two variants are compared on exactly the same measurements (the machine's noise
between runs is larger than most of what one setting changes).

    python bench/resimulate.py validation/                        # as validated
    python bench/resimulate.py validation/ --set host.wakeup_s=0  # without the wake-up wait
    python bench/resimulate.py validation/ --set host.socket_buffer_bytes=1.2MB --only ps-
    python bench/resimulate.py validation/ --rebuild              # traces built anew
    python bench/resimulate.py validation/ --sim-seeds 1 --sim-jitter 0  # deterministic

``--rebuild`` builds each repeat's measured trace and preset again from the real run's
records kept in ``real/`` (validations from 2026-11-24 on keep them), with this
checkout's code (into a scratch folder; the validation's own files stay as they are):
a what-if on how the real run is read, not only on the model.

Keys are the preset's own, dotted (``host.socket_buffer_bytes``, ``network.lead_s``,
``gpu.predict_overhead_s``; older names such as ``network.lead`` name the same keys, as
:mod:`simcore.preset_keys` declares them); values are read as YAML (numbers stay
numbers, ``1.2MB`` stays text for the preset's parser). Each repeat is simulated as
``sim validate`` simulates it (``--sim-seeds`` simulations with ``--sim-jitter``, their
mean; the same defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def override(preset: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of ``preset`` with the dotted ``key`` set to ``value`` (the machine sections'
    keys named by their fields, :func:`simcore.preset_keys.canonical`)."""
    from simcore.preset_keys import canonical, canonical_path

    out = canonical(json.loads(json.dumps(preset)))  # deep copy of plain YAML data
    node = out
    *path, last = canonical_path(key).split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="a sim validate output folder")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="preset key to override (repeatable)")  # fmt: skip
    ap.add_argument("--only", default="", help="only cases whose id starts with this (ps-, p3-cnn)")
    ap.add_argument("--rebuild", action="store_true",
                    help="build the measured traces again from the kept records")  # fmt: skip
    from analysis.matrix_defaults import SIM_JITTER, SIM_SEEDS

    ap.add_argument("--sim-seeds", type=int, default=SIM_SEEDS,
                    help=f"simulations per repeat (default {SIM_SEEDS})")  # fmt: skip
    ap.add_argument("--sim-jitter", type=float, default=SIM_JITTER,
                    help=f"their compute jitter, a CV (default {SIM_JITTER})")  # fmt: skip
    args = ap.parse_args(argv)
    from analysis.validation.replay import Ensemble
    from simcore.config import ConfigError

    try:
        ensemble = Ensemble(args.sim_seeds, args.sim_jitter)
    except ConfigError as exc:
        ap.error(str(exc))

    import tempfile

    import yaml

    sets = []
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--set {item!r}: expected KEY=VALUE, e.g. host.wakeup_s=0")
        sets.append((key, yaml.safe_load(value)))
    if not args.rebuild:
        return _compare(args.out, args.out, sets, args.only, False, ensemble)
    with tempfile.TemporaryDirectory(prefix="dtsim-resimulate-") as scratch:
        return _compare(args.out, scratch, sets, args.only, True, ensemble)


def _compare(
    out: str, scratch: str, sets: list[Any], only: str, rebuild: bool, ensemble: Any
) -> int:
    """Simulate every repeat of ``out`` again as ``ensemble`` says (its measured traces
    and presets, or with ``rebuild`` those built anew into ``scratch``) and print the
    comparison."""
    import pandas as pd

    from analysis.resolve import load_preset
    from analysis.validation.harness import table_path
    from analysis.validation.matrix import case_from_row
    from analysis.validation.replay import (
        measured_case_config,
        measured_files,
        remeasure,
        simulate_ensemble,
    )

    table = pd.read_parquet(table_path(out))
    errors_was, errors_now = [], []
    print(f"{'case':44} {'measured':>9} {'validated':>17} {'now':>17}")
    for _, row in table.iterrows():
        if row.status != "ok" or not row.point_id.startswith(only):
            continue
        case = case_from_row(row)
        times = []
        try:
            for k in range(int(row.repeats)):
                if rebuild:
                    remeasure(case, out, k, scratch, ensemble)
                preset = None
                if sets:
                    preset = dict(load_preset(measured_files(case, scratch, k)[1]))
                    for key, value in sets:
                        preset = override(preset, key, value)
                config = measured_case_config(case, scratch, k, preset)
                times.append(simulate_ensemble(config, ensemble).iteration_time_s)
        except FileNotFoundError as exc:
            print(f"{row.point_id:44} skipped: {exc}")
            continue
        real, was, now = (
            row.real_iteration_time_s,
            row.sim_iteration_time_s,
            statistics.median(times),
        )
        errors_was.append(abs(was / real - 1))
        errors_now.append(abs(now / real - 1))
        print(
            f"{row.point_id:44} {real * 1e3:7.1f}ms {was * 1e3:7.1f}ms {was / real - 1:+7.1%}"
            f" {now * 1e3:7.1f}ms {now / real - 1:+7.1%}"
        )
    if errors_now:
        print(
            f"median |rel err| validated {statistics.median(errors_was):.1%} (max "
            f"{max(errors_was):.1%}), now {statistics.median(errors_now):.1%} (max "
            f"{max(errors_now):.1%}) over {len(errors_now)} cases"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
