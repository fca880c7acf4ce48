"""The validation's report: ``report.md``, its scatter and its timelines.

:func:`write_report` turns the rows into the report: the summary (the prediction's
errors first, the replay's as a diagnostic), the worst predictions, every case, the
failed ones, the calibrations used and each case's measured timeline above its replay's
(:func:`timeline_figure`, from the Chrome traces at
:func:`timeline_paths`), with a scatter of predicted against measured time
(:func:`scatter_figure`).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.validation.matrix import SCHEMES, case_from_row
from analysis.validation.prediction import PREDICTIONS
from analysis.validation.rows import (
    HIT,
    is_number,
    predicted_s,
    prediction_err,
    summarise,
    summarise_prediction,
)


def timeline_paths(out_dir: str, case_id: str) -> tuple[str, str, str]:
    """``(measured Chrome trace, simulated Chrome trace, side-by-side PNG)`` of a case."""
    base = os.path.join(out_dir, "timelines", case_id)
    return base + ".real.json", base + ".sim.json", base + ".png"


def scatter_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Predicted against measured iteration time, one point per case (error bars: the
    real runs' min to max), each case's replay beside it as a small cross, with y = x
    and the +-5 % and +-15 % bands."""
    from analysis.plots import _pyplot, _theme

    _theme()
    plt = _pyplot()
    ok = [r for r in rows if r.get("status") == "ok"]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    xs = [1e3 * float(r["real_iteration_time_s"]) for r in ok]
    ys = [1e3 * float(r["sim_iteration_time_s"]) for r in ok]
    ys += [1e3 * predicted_s(r) for r in ok if not math.isnan(predicted_s(r))]
    span = xs + ys
    span += [1e3 * float(r["real_iteration_time_min_s"]) for r in ok]
    span += [1e3 * float(r["real_iteration_time_max_s"]) for r in ok]
    span += [1e3 * v for r in ok for v in _sim_range_s(r) or ()]
    lo = min(span) * 0.8 if span else 1.0
    hi = max(span) * 1.2 if span else 10.0
    line = [lo, hi]
    ax.plot(line, line, color="black", linewidth=1, label="y = x")
    for band, alpha in ((0.15, 0.10), (0.05, 0.18)):
        ax.fill_between(
            line,
            [v * (1 - band) for v in line],
            [v * (1 + band) for v in line],
            color="tab:green",
            alpha=alpha,
            linewidth=0,
            label=f"±{int(band * 100)}%",
        )
    schemes = list(dict.fromkeys(r["scheme"] for r in ok))
    models = list(dict.fromkeys(r["model"] for r in ok))
    marker_of = {m: mk for m, mk in zip(models, ["o", "s", "^", "D", "v"] * 4, strict=False)}
    for s in schemes:
        for m in models:
            pts = [r for r in ok if r["scheme"] == s and r["model"] == m]
            if not pts:
                continue
            x = [1e3 * float(r["real_iteration_time_s"]) for r in pts]
            y = [1e3 * predicted_s(r) for r in pts]
            xerr = [
                [a - 1e3 * float(r["real_iteration_time_min_s"]) for a, r in zip(x, pts)],
                [1e3 * float(r["real_iteration_time_max_s"]) - a for a, r in zip(x, pts)],
            ]
            color = f"C{schemes.index(s) % 10}"
            ax.errorbar(
                x,
                y,
                xerr=xerr,
                fmt=marker_of[m],
                color=color,
                label=f"{s}, {m}",
                markersize=5,
                capsize=2,
            )
            replay = [1e3 * float(r["sim_iteration_time_s"]) for r in pts]
            ax.scatter(x, replay, marker="x", color=color, s=14, alpha=0.6, linewidths=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _pos: int) -> str:
        # minor ticks labelled at 2x, 3x and 5x a power of ten only: 6-9 crowd together
        leading = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return f"{v:g}" if leading in (1, 2, 3, 5) else ""

    plain = FuncFormatter(label)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="both", labelsize=8)
    ax.set_xlabel("measured iteration time (ms, median; bars: min to max)")
    ax.set_ylabel("predicted iteration time (ms; x: the replay)")
    ax.scatter([], [], marker="x", color="grey", label="replay (diagnostic)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title("sim validate: predicted against measured")
    return fig


def timeline_figure(real_trace: Mapping[str, Any], sim_trace: Mapping[str, Any], title: str) -> Any:
    """The measured timeline of one case above its replay's (the run simulated on its own
    measured compute, not the prediction), on the same time axis (two panels of
    :func:`analysis.plots.gantt_plot`)."""
    from analysis.plots import _pyplot, _theme, gantt_plot

    _theme()
    plt = _pyplot()

    def lanes(trace: Mapping[str, Any]) -> int:
        """Rows of the Gantt chart: one per device and stream (extra lanes merged)."""
        names = {
            (e["pid"], e["tid"]): str(e["args"]["name"]).split(" #")[0]
            for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        return len(
            {
                (e.get("pid"), names.get((e.get("pid"), e.get("tid")), e.get("tid")))
                for e in trace["traceEvents"]
                if e.get("ph") == "X"
            }
        )

    n_real, n_sim = max(1, lanes(real_trace)), max(1, lanes(sim_trace))
    height = min(0.3 * (n_real + n_sim) + 2.5, 40.0)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, height), sharex=True, height_ratios=[n_real, n_sim]
    )
    gantt_plot(real_trace, ax=top, title=f"measured: {title}", xlabel="")
    gantt_plot(sim_trace, ax=bottom, title=f"replay: {title}", xlabel="time (ms)")
    fig.tight_layout()
    return fig


def _iterations(row: Mapping[str, Any]) -> str:
    """A row's measured iterations per run (tables before 2026-11-25: ``iterations``)."""
    return str(case_from_row(row).measured_iterations)


def _fmt_ms(v: Any) -> str:
    return f"{1e3 * float(v):.1f}"


def _pct(v: Any) -> str:
    return f"{100 * float(v):+.1f}%"


def _sim_range_s(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """A row's fastest and slowest simulation, where it has them (rows of validations
    from before the ensemble do not)."""
    lo, hi = row.get("sim_iteration_time_min_s"), row.get("sim_iteration_time_max_s")
    if lo is None or hi is None or math.isnan(float(lo)) or math.isnan(float(hi)):
        return None
    return float(lo), float(hi)


def _sim_ms(row: Mapping[str, Any]) -> str:
    """A row's simulated time, with the range of its simulations where it has one."""
    text = _fmt_ms(row["sim_iteration_time_s"])
    rng = _sim_range_s(row)
    return text if rng is None else f"{text} ({_fmt_ms(rng[0])}-{_fmt_ms(rng[1])})"


def _ensemble_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """How the rows' simulated times were made (:class:`Ensemble`), in a sentence."""
    kinds = {
        (int(r["sim_seeds"]), float(r["sim_jitter"]))
        for r in rows
        if r.get("sim_seeds") is not None and not math.isnan(float(r["sim_seeds"]))
    }
    if len(kinds) != 1:
        return "Simulated is the median over the real runs of each one's simulation(s)."
    ((seeds, jitter),) = kinds
    if seeds == 1:
        return "Simulated is the median over the real runs of each one's simulation."
    return (
        f"Simulated is the median over the real runs of the mean of each one's {seeds} "
        f"simulations (each op's CPU work varied by a log-normal factor, coefficient of "
        f"variation {jitter:g}, one seed each); its range is over all of them."
    )


def write_report(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str,
    *,
    command: str = "",
    calibrations: Sequence[str] = (),
    worst: int = 5,
) -> str:
    """Write ``report.md``, ``scatter.png`` and the cases' side-by-side timelines (those
    whose Chrome traces exist) into ``out_dir``; returns the report's path."""
    from analysis.plots import save_figure
    from analysis.report import md_table
    from traces.atomic import write_text

    rows = [dict(r) for r in rows]
    order = {s: i for i, s in enumerate(SCHEMES)}
    rows.sort(
        key=lambda r: (
            order.get(r["scheme"], 99),
            r["model"],
            r.get("bandwidth_bytes_per_s", 0),
            r["ranks"],
        )
    )
    ok = [r for r in rows if r.get("status") == "ok"]
    bad = [r for r in rows if r.get("status") != "ok"]
    med, mx, exact = summarise(rows)
    p_med, p_mx = summarise_prediction(rows)
    predicted = [r for r in ok if is_number(r.get("prediction_rel_err"))]

    def within(key: str, band: float, among: Sequence[Mapping[str, Any]]) -> int:
        return sum(abs(float(r[key])) <= band for r in among)

    lines = ["# Validation: predicted against measured", ""]
    if command:
        lines += ["Produced by:", "", "```sh", command, "```", ""]
    sources = sorted({str(r.get("prediction_source") or "") for r in predicted} - {""})
    lines += [
        "## Summary",
        "",
        md_table(
            ["", "value"],
            [
                ["cases", str(len(rows))],
                ["cases run", str(len(ok))],
                ["cases failed", str(len(bad))],
                [
                    "**prediction**: median / max abs(rel err) of iteration time",
                    f"**{pct_or_na(p_med)} / {pct_or_na(p_mx)}**",
                ],
                [
                    "prediction within 5% / 15%",
                    f"{within('prediction_rel_err', HIT, predicted)} / "
                    f"{within('prediction_rel_err', 0.15, predicted)} of {len(predicted)}",
                ],
                ["predictions", "; ".join(sources) or "n/a"],
                [
                    "replay (diagnostic): median / max abs(rel err)",
                    f"{pct_or_na(med)} / {pct_or_na(mx)}",
                ],
                [
                    "replay within 5% / 15%",
                    f"{within('rel_err', HIT, ok)} / {within('rel_err', 0.15, ok)} of {len(ok)}",
                ],
                ["bytes per link exact", f"{exact} of {len(ok)}"],
                [
                    "median spread of the real runs",
                    f"{100 * statistics.median([float(r['real_spread']) for r in ok]):.1f}%"
                    if ok
                    else "n/a",
                ],
            ],
        ),
        "",
        "The **prediction** is the simulation made before a case's real runs, from the "
        "model's profile and the cluster's calibration only (registered in "
        f"`{PREDICTIONS}` before the runs where it says so): one profile per model, taken "
        "in the data-parallel runtime on two ranks sharing the machine's cores at two "
        "batch sizes, serves every case of the model, its micro-batches included; the "
        "messaging costs under load (beside compute, a pipeline's send holds) are the "
        "calibration's, a server's handling per shard the profile's optimizer step. "
        "The **replay** simulates each real run again on what that run measured (its "
        "layer times, its messaging threads' CPU, its send holds): it separates a "
        "wrong input from a wrong model and is not a prediction. Relative error is "
        "(simulated - measured) / measured, "
        "measured being the median of the repeated real runs; spread is (max - min) / "
        "median over those runs, each run's time the mean of its measured iterations "
        "(the column iterations: enough for the run to measure its case's seconds at "
        "the predicted time). " + _ensemble_note(ok),
        "",
    ]
    if ok:
        fig = scatter_figure(ok)
        save_figure(fig, os.path.join(out_dir, "scatter.png"))
        lines += ["![simulated against measured](scatter.png)", ""]
        lines += ["## Worst predictions", ""]
        worst_rows = sorted(ok, key=lambda r: -abs(prediction_err(r)))[:worst]
        lines += [
            md_table(
                [
                    "case",
                    "measured ms",
                    "predicted ms",
                    "prediction error",
                    "replay error",
                    "spread",
                    "why (replay)",
                ],
                [
                    [
                        f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}",
                        _fmt_ms(r["real_iteration_time_s"]),
                        _fmt_ms(predicted_s(r)),
                        _pct(prediction_err(r)),
                        _pct(r["rel_err"]),
                        f"{100 * float(r['real_spread']):.1f}%",
                        r.get("why") or "hit",
                    ]
                    for r in worst_rows
                ],
            ),
            "",
        ]
        lines += ["## Every case", ""]
        lines += [
            md_table(
                [
                    "scheme",
                    "model",
                    "bandwidth",
                    "ranks",
                    "iterations",
                    "measured ms (min-max)",
                    "predicted ms",
                    "prediction error",
                    "replay ms (min-max)",
                    "replay error",
                    "spread",
                    "samples/s real / sim",
                    "bytes exact",
                    "util real / sim",
                    "bubble real / sim",
                ],
                [
                    [
                        r["scheme"],
                        r["model"],
                        r["bandwidth"],
                        str(r["ranks"]),
                        _iterations(r),
                        f"{_fmt_ms(r['real_iteration_time_s'])} "
                        f"({_fmt_ms(r['real_iteration_time_min_s'])}-"
                        f"{_fmt_ms(r['real_iteration_time_max_s'])})",
                        _fmt_ms(predicted_s(r)),
                        _pct(prediction_err(r)),
                        _sim_ms(r),
                        _pct(r["rel_err"]),
                        f"{100 * float(r['real_spread']):.1f}%",
                        f"{float(r['real_throughput_samples_s']):.0f} / "
                        f"{float(r['sim_throughput_samples_s']):.0f}",
                        "yes"
                        if _truthy(r["bytes_exact"])
                        else f"**no** ({r.get('bytes_max_link_diff', '?')} B off)",
                        f"{r['real_utilization']} / {r['sim_utilization']}",
                        f"{100 * float(r['real_bubble']):.0f}% / "
                        f"{100 * float(r['sim_bubble']):.0f}%",
                    ]
                    for r in ok
                ],
            ),
            "",
        ]
    if bad:
        lines += ["## Failed cases", ""]
        lines += [
            md_table(
                ["case", "error"],
                [
                    [
                        f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}",
                        r.get("error", ""),
                    ]
                    for r in bad
                ],
            ),
            "",
        ]
    speed = _machine_speed(ok)
    if speed:
        lines += ["## The machine's speed", "", speed, ""]
    used = {str(r["calibration"]) for r in ok if r.get("calibration")}
    given = [p for p in calibrations if os.path.abspath(p) not in used]
    every = [*sorted(used), *given]
    if every:
        lines += ["## Calibration", ""]
        for path in every:
            lines += [f"`{os.path.relpath(path, out_dir)}`:", ""]
            at = [r for r in ok if r.get("calibration") == path]
            if at:
                lines += [_calibration_use(at), ""]
            lines += [_calibration_summary(path), ""]
    shown = []
    for r in ok:
        real_p, sim_p, png = timeline_paths(out_dir, r["point_id"])
        if not (os.path.exists(real_p) and os.path.exists(sim_p)):
            continue
        if not os.path.exists(png):
            from analysis.plots import read_chrome_trace

            title = f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}"
            fig = timeline_figure(read_chrome_trace(real_p), read_chrome_trace(sim_p), title)
            save_figure(fig, png)
        shown.append((r, png, real_p, sim_p))
    if shown:
        lines += [
            "## Timelines, measured above the replay",
            "",
            "Each case's median repeat above its replay (that run simulated on its own "
            "measured compute; a diagnostic, not the prediction).",
            "",
        ]
        for r, png, real_p, sim_p in shown:
            rel = os.path.relpath(png, out_dir)
            lines += [
                f"### {r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']} "
                f"(replay {_pct(r['rel_err'])}"
                + (
                    f", prediction {_pct(r['prediction_rel_err'])})"
                    if r.get("prediction_rel_err") not in (None, "")
                    else ")"
                ),
                "",
                f"![{r['point_id']}]({rel})",
                "",
                f"Chrome traces: `{os.path.relpath(real_p, out_dir)}`, "
                f"`{os.path.relpath(sim_p, out_dir)}`.",
                "",
            ]
    path = os.path.join(out_dir, "report.md")
    write_text(path, "\n".join(lines))
    return path


SPEED_FLAG = 0.15
"""How far the machine's compute probe beside a case may move from the profile's before
the report names the case."""


def _machine_speed(rows: Sequence[Mapping[str, Any]]) -> str:
    """One paragraph: the cases' compute probes against their profiles' (the column
    ``machine_vs_profile``), and the cases where it moved more than :data:`SPEED_FLAG`;
    empty when no row has one."""
    have = [r for r in rows if is_number(r.get("machine_vs_profile"))]  # not nan
    ratios = [float(r["machine_vs_profile"]) for r in have]
    if not ratios:
        return ""
    text = (
        f"A fixed step of single-thread compute took {statistics.median(ratios):.2f}x as "
        f"long beside the cases' runs as when their models were profiled "
        f"(median; {min(ratios):.2f}-{max(ratios):.2f}x). Above 1 the machine computed "
        f"slower than at its profile. The probe is short: it flags a machine that moved, "
        f"not how fast a case's ranks computed, so it corrects nothing."
    )
    moved = [
        f"{r['point_id']} {float(r['machine_vs_profile']):.2f}x"
        for r in have
        if abs(float(r["machine_vs_profile"]) - 1) > SPEED_FLAG
    ]
    if moved:
        text += f" Moved more than {SPEED_FLAG:.0%}: " + ", ".join(moved) + "."
    return text


def _calibration_use(rows: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: when the calibration was measured, its age at the cases' runs, and
    which cases used it at another link rate than it was measured at."""
    first = rows[0]
    ages = [float(r["calibration_age_h"]) for r in rows if is_number(r.get("calibration_age_h"))]
    when = first.get("calibration_date") or "an unrecorded time"
    text = f"measured {when}"
    if first.get("calibration_rate"):
        text += f" at {first['calibration_rate']}"
    if ages:
        text += f"; {min(ages):.1f}-{max(ages):.1f} h old when its cases ran"
    moved = sorted({str(r["bandwidth"]) for r in rows if _truthy(r.get("calibration_moved"))})
    if moved:
        text += f"; moved to {', '.join(moved)} for the cases at those rates (the what-if)"
    return text + "."


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("true", "1", "yes")


def _calibration_summary(path: str) -> str:
    """The calibrated numbers that matter, as a small table."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"(cannot be read: {exc})"
    rows: list[list[str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                if k in ("box", "name", "summary"):
                    continue
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif not isinstance(value, list):
            rows.append([prefix, str(value)])

    walk("", data)
    from analysis.report import md_table

    head = f"{data['summary']}\n\n" if isinstance(data.get("summary"), str) else ""
    return head + (md_table(["setting", "value"], rows) if rows else "(empty)")


def pct_or_na(v: float) -> str:
    """A fraction as a percentage (``12.3%``), ``n/a`` for ``nan``."""
    return "n/a" if math.isnan(v) else f"{100 * v:.1f}%"
