"""How far repeated registered runs of one matrix agree: per case, each run's prediction
error, their range, and how much the measured and the predicted times moved between runs.

Each folder is one ``sim validate --predict-only --out DIR && sim validate --out DIR`` of
the same matrix (fresh calibration, profiles and predictions each). A case whose errors
keep their sign and size across runs is a miss of the model; one whose errors range over
tens of points is a miss of the measurement (the machine's speed moved between the
profile and the runs), which no single run can tell apart. Also printed, per run: the
median |error|, the signed mean, and (where the folder has them) the machine-speed probe's
median ratio to the profile's.

Usage::

    python bench/registered_spread.py DIR1 DIR2 [DIR3 ...] [--out spread.csv]
"""

from __future__ import annotations

import argparse
import os

import pandas as pd


def load(dirs: list[str]) -> dict[str, pd.DataFrame]:
    """Each folder's ``validation.csv`` by point id, keyed by the folder's name less the
    words all the names start with (``run-2026-a``, ``run-2026-b``: ``a``, ``b``)."""
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    common = 0  # the characters every name starts with, cut back to a separator
    while all(len(n) > common and n[common] == names[0][common] for n in names):
        common += 1
    cut = max(names[0].rfind(sep, 0, common) for sep in "-_.") + 1
    return {
        name[cut:]: pd.read_csv(os.path.join(d, "validation.csv")).set_index("point_id")
        for name, d in zip(names, dirs, strict=True)
    }


def spread(runs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Per case present in every run: each run's prediction error (%), their range
    (points), the sign they share (``+``/``-``, or ``mixed``), and the ratios max/min
    of the measured and of the predicted iteration times over the runs."""
    ids = sorted(set.intersection(*(set(df.index) for df in runs.values())))
    err = pd.DataFrame({k: df.loc[ids, "prediction_rel_err"] * 100 for k, df in runs.items()})
    meas = pd.DataFrame({k: df.loc[ids, "real_iteration_time_s"] for k, df in runs.items()})
    pred = pd.DataFrame({k: df.loc[ids, "predicted_iteration_time_s"] for k, df in runs.items()})
    table = err.copy()
    table["range_points"] = err.max(axis=1) - err.min(axis=1)
    table["sign"] = [
        "-" if (row < 0).all() else "+" if (row > 0).all() else "mixed" for _, row in err.iterrows()
    ]
    table["measured_max_over_min"] = meas.max(axis=1) / meas.min(axis=1)
    table["predicted_max_over_min"] = pred.max(axis=1) / pred.min(axis=1)
    return table.sort_values("range_points")


def summary(runs: dict[str, pd.DataFrame], table: pd.DataFrame) -> list[str]:
    """Per run: median |error|, signed mean, within 5 / 15%, the probe's median ratio."""
    lines = []
    for name, df in runs.items():
        e = df["prediction_rel_err"].dropna() * 100
        line = (
            f"{name}: median |error| {e.abs().median():.1f}%, max {e.abs().max():.1f}%, "
            f"signed mean {e.mean():+.1f}%, within 5% {int((e.abs() <= 5).sum())}, "
            f"within 15% {int((e.abs() <= 15).sum())} of {len(e)}"
        )
        if "machine_vs_profile" in df and df["machine_vs_profile"].notna().any():
            r = df["machine_vs_profile"].dropna()
            line += f"; probe {r.median():.2f}x the profile's ({r.min():.2f}-{r.max():.2f}x)"
        lines.append(line)
    lines.append(
        f"per case over the runs: error range median {table.range_points.median():.1f} "
        f"points (max {table.range_points.max():.1f}); measured times max/min median "
        f"{table.measured_max_over_min.median():.2f}x, predicted "
        f"{table.predicted_max_over_min.median():.2f}x; same sign in every run: "
        f"{int((table.sign != 'mixed').sum())} of {len(table)}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", help="validation folders of the same matrix")
    parser.add_argument("--out", help="also write the per-case table as CSV")
    args = parser.parse_args()
    if len(args.dirs) < 2:
        parser.error("give at least two runs' folders")
    runs = load(args.dirs)
    if len(runs) < len(args.dirs):
        parser.error("the folders must have different names (they label the columns)")
    table = spread(runs)
    with pd.option_context("display.width", 200, "display.max_rows", None):
        print(table.round(2).to_string())
    print()
    print("\n".join(summary(runs, table)))
    if args.out:
        table.round(4).to_csv(args.out)


if __name__ == "__main__":
    main()
