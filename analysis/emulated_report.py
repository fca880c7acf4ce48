"""The seed papers' comparisons measured on emulated devices, beside the simulator's:
the section ``sim report --emulated DIR`` adds from ``sim validate --device emulated``
results (``DIR/results.csv``; several folders are read together).

Every comparison is made twice from the same rows: with the real runs' iteration times
and with the times predicted (registered) before them, so the two columns say whether
the simulator reaches the paper's conclusion the way the real system does. A comparison
whose rows are missing says which ``--matrix`` makes them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from analysis.report import md_table


def read_results(folders: Sequence[str]) -> Any:
    """The counted rows (status ``ok``) of every folder's ``results.csv``, together."""
    import pandas as pd

    frames = []
    for folder in folders:
        path = os.path.join(folder, "results.csv") if os.path.isdir(folder) else folder
        frames.append(pd.read_csv(path))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    return df.drop_duplicates("case_id", keep="last") if "case_id" in df.columns else df


def _time(df: Any, source: str, **where: Any) -> float | None:
    rows = df
    for k, v in where.items():
        rows = rows[rows[k] == v]
    if rows.empty:
        return None
    col = "real_iteration_time_s" if source == "real" else "predicted_iteration_time_s"
    return float(rows[col].iloc[0])


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def p3_over_ps(df: Any) -> str:
    """P3's speedup over the parameter server (``ps`` time / ``p3`` time) by model,
    ranks and bandwidth."""
    rows = []
    keys = df[df["scheme"] == "p3"][["trace", "gpus", "bandwidth"]].drop_duplicates()
    for _, k in keys.iterrows():
        w = {"trace": k["trace"], "gpus": k["gpus"], "bandwidth": k["bandwidth"]}
        ps_r, p3_r = _time(df, "real", scheme="ps", **w), _time(df, "real", scheme="p3", **w)
        ps_p, p3_p = _time(df, "pred", scheme="ps", **w), _time(df, "pred", scheme="p3", **w)
        if ps_r and p3_r:
            rows.append(
                (k["trace"], k["gpus"], k["bandwidth"], _ratio(ps_r, p3_r), _ratio(ps_p, p3_p))
            )
    if not rows:
        return "*No rows: run ps and p3 on the same model, ranks and bandwidth.*\n"
    return md_table(("model", "workers", "bandwidth", "measured", "predicted"), rows)


def vs_dp(df: Any, scheme: str) -> str:
    """``scheme``'s throughput over ``dp``'s (``dp`` time / its time) by model, ranks and
    bandwidth."""
    rows = []
    keys = df[df["scheme"] == scheme][["trace", "gpus", "bandwidth"]].drop_duplicates()
    for _, k in keys.sort_values("gpus").iterrows():
        w = {"trace": k["trace"], "gpus": k["gpus"], "bandwidth": k["bandwidth"]}
        d_r, s_r = _time(df, "real", scheme="dp", **w), _time(df, "real", scheme=scheme, **w)
        d_p, s_p = _time(df, "pred", scheme="dp", **w), _time(df, "pred", scheme=scheme, **w)
        if d_r and s_r:
            gain = (_ratio(d_r, s_r), _ratio(d_p, s_p))
            rows.append((k["trace"], k["gpus"], k["bandwidth"], *gain))
    if not rows:
        return f"*No rows: run {scheme} and dp on the same model, ranks and bandwidth.*\n"
    return md_table(("model", "ranks", "bandwidth", "measured", "predicted"), rows)


def pipeline_speedups(df: Any) -> str:
    """Every pipeline's speedup over one device at its number of stages."""
    from simcore.schemes import schemes_where

    pipes = df[df["scheme"].isin(schemes_where("pipeline"))].sort_values(["gpus", "scheme"])
    rows = [
        (r["scheme"], r["trace"], r["gpus"], r["bandwidth"], f"{r['real_speedup']:.2f}x",
         f"{r['predicted_speedup']:.2f}x")
        for _, r in pipes.iterrows()
    ]  # fmt: skip
    if not rows:
        return "*No rows: run a pipeline scheme (--matrix seed or scaling).*\n"
    return md_table(("scheme", "model", "stages", "bandwidth", "measured", "predicted"), rows)


def zero_bubble(df: Any) -> str:
    """Each schedule's throughput over synchronous 1F1B's (``1f1b`` time / its time) on
    the same model, ranks and bandwidth, measured and predicted (the zero-bubble paper's
    comparison; ``--matrix schedules`` makes the rows)."""
    from analysis.emulated_validation import SCHEDULE_NAMES

    others = [s for s in SCHEDULE_NAMES if s != "1f1b"]
    keys = df[df["scheme"] == "1f1b"][["trace", "gpus", "bandwidth"]].drop_duplicates()
    rows = []
    for _, k in keys.iterrows():
        w = {"trace": k["trace"], "gpus": k["gpus"], "bandwidth": k["bandwidth"]}
        base = _time(df, "real", scheme="1f1b", **w), _time(df, "pred", scheme="1f1b", **w)
        cells = []
        for scheme in others:
            real, pred = (
                _time(df, "real", scheme=scheme, **w),
                _time(df, "pred", scheme=scheme, **w),
            )
            cells.append(f"{_ratio(base[0], real)} / {_ratio(base[1], pred)}" if real else "-")
        rows.append((k["trace"], k["gpus"], k["bandwidth"], *cells))
    if not rows:
        return "*No rows: run 1f1b and the other schedules (--matrix schedules).*\n"
    return md_table(("model", "ranks", "bandwidth", *others), rows)


def emulated_section(folders: Sequence[str]) -> str:
    """The report's section on emulated devices (see module docs)."""
    df = read_results(folders)
    if df.empty:
        return "## On emulated devices\n\n*No counted rows in the results given.*\n"
    parts = [
        "## On emulated devices: measured beside predicted\n",
        f"From `sim validate --device emulated` results in {', '.join(folders)}: "
        f"{len(df)} counted cases (CPU-flagged and failed ones left out). 'measured' uses the "
        "real runs' iteration times, 'predicted' the registered predictions.\n",
        "### P3 over the parameter server\n",
        p3_over_ps(df),
        "### GossipGraD against all-reduce (`dp`) as ranks grow\n",
        vs_dp(df, "gossip"),
        "### SpecTrain's throughput against `dp`'s\n",
        vs_dp(df, "spectrain"),
        "### Pipelines: speedup over one device\n",
        pipeline_speedups(df),
        "### Zero-bubble and interleaved schedules against 1F1B (measured / predicted)\n",
        zero_bubble(df),
    ]
    return "\n".join(parts)
