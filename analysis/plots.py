"""Seaborn figures of sweep results and of Chrome traces.

Generic: :func:`xy_plot` draws any column against any other (lines for a numeric x, bars
for a categorical one), coloured by ``hue`` and split into panels by ``col``. Ready kinds
(:data:`KINDS`): ``speedup`` (speedup vs GPUs, with the linear ideal), ``throughput``
(throughput vs inter-node bandwidth), ``utilization`` (utilisation of each GPU), and
``gantt`` (a timeline of a ``sim run --trace-out`` file).

A ``bandwidth`` column (``"10Gbps"``...) is plotted as numbers in Gbit/s on a log axis.
Rows of failed points are left out. Every function returns a matplotlib ``Figure``;
:func:`save_figure` writes it (PNG, SVG or PDF) atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from simcore.config import ConfigError
from simcore.units import UnitError, parse_rate

KINDS = ("auto", "line", "bar", "speedup", "throughput", "utilization", "prediction", "gantt")
"""Plot kinds: ``auto`` picks ``line`` or ``bar`` from the type of ``x``."""

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")

LABELS = {
    "gpus": "GPUs",
    "bandwidth": "inter-node bandwidth (Gbit/s)",
    "throughput_samples_s": "throughput (samples/s)",
    "speedup": "speedup over 1 GPU",
    "iteration_time_s": "iteration time (s)",
    "gpu_utilization": "mean GPU utilisation",
    "bubble_fraction": "idle (bubble) fraction",
    "comm_bytes_per_iteration": "bytes sent per iteration",
    "peak_memory_bytes": "peak GPU memory (bytes)",
    "scaling_efficiency": "scaling efficiency (speedup / GPUs)",
    "batch_size": "batch size per replica",
    "wall_s": "simulation wall time (s)",
}
"""Axis labels of well-known columns."""

_BW = "_bandwidth_gbps"


def label(col: str) -> str:
    """Axis label for column ``col``."""
    return LABELS.get(col, col.replace("_", " "))


def swept_columns(df: Any) -> list[str]:
    """Columns of ``df`` that describe a run's settings (spec fields, ``scheme.KEY``)."""
    from simcore.spec import FIELDS

    return [
        c for c in df.columns if (c in FIELDS and c != "scheme_options") or c.startswith("scheme.")
    ]


def select_rows(df: Any, where: Mapping[str, str] | None = None) -> Any:
    """Rows of successful points matching every ``column=value`` of ``where`` (values
    compared as text, or as numbers when both sides are numbers). ``ConfigError`` for an
    unknown column or when nothing is left."""
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    for col, want in (where or {}).items():
        if col not in df.columns:
            raise ConfigError(
                "where",
                f"{col}={want}",
                f"no column {col!r}; columns: {', '.join(map(str, df.columns))}",
            )
        df = df[_matches(df[col], str(want))]
    if df.empty:
        shown = " ".join(f"{k}={v}" for k, v in (where or {}).items()) or "(all rows)"
        raise ConfigError("where", shown, "selects no successful rows")
    return df


def _matches(series: Any, want: str) -> Any:
    try:
        num = float(want)
    except ValueError:
        return series.astype(str) == want
    as_num = _to_numeric(series)
    return (as_num == num) | (series.astype(str) == want)


def _to_numeric(series: Any) -> Any:
    import pandas as pd

    return pd.to_numeric(series, errors="coerce")


def require(df: Any, **cols: str | None) -> None:
    """``ConfigError`` naming the first option (``x="bandwidth"`` is ``--x``) whose
    column ``df`` lacks."""
    for opt, c in cols.items():
        if (
            c
            and c not in df.columns
            and not (c == "bandwidth" and "bandwidth_bytes_per_s" in df.columns)
        ):
            raise ConfigError(
                opt, c, f"not a column of the results; columns: {', '.join(map(str, df.columns))}"
            )


def bandwidth_gbps(df: Any) -> Any:
    """Inter-node bandwidth of each row in Gbit/s (from ``bandwidth_bytes_per_s`` or the
    ``bandwidth`` strings); ``ConfigError`` for a value that is not a rate."""
    if "bandwidth_bytes_per_s" in df.columns:
        return _to_numeric(df["bandwidth_bytes_per_s"]) * 8 / 1e9

    def gbps(v: Any) -> float:
        try:
            return parse_rate(v) * 8 / 1e9
        except UnitError:
            raise ConfigError(
                "bandwidth",
                v,
                "expected a rate such as 10Gbps (an empty "
                "value is the preset's: sweep it explicitly)",
            ) from None

    return df["bandwidth"].map(gbps)


def _ordered(series: Any) -> list[Any]:
    """Distinct values in numeric order when they are numbers, else in order of
    appearance."""
    values = list(dict.fromkeys(series.dropna()))
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sorted(values)
    return values


def _as_category(df: Any, col: str | None) -> Any:
    """``df`` with column ``col`` turned into ordered text labels (a discrete legend)."""
    if not col:
        return df
    import pandas as pd

    order = _ordered(df[col])
    text = [_fmt(v) for v in order]
    df = df.copy()
    df[col] = pd.Categorical(df[col].map(_fmt), categories=text, ordered=True)
    return df


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _is_numeric(series: Any) -> bool:
    return bool(_to_numeric(series).notna().all()) and series.dtype != bool


def _pyplot() -> Any:
    import matplotlib.pyplot as plt

    return plt


GANTT_KINDS = ("forward", "backward", "update", "send", "recv", "wait", "allreduce", "aggregate")
"""Span kinds with a colour of their own in every Gantt chart."""


def _theme() -> Any:
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return sns


def xy_plot(
    df: Any,
    x: str,
    y: str,
    *,
    hue: str | None = None,
    col: str | None = None,
    kind: str = "auto",
    where: Mapping[str, str] | None = None,
    logx: bool | None = None,
    title: str | None = None,
) -> Any:
    """``y`` against ``x`` coloured by ``hue``, one panel per value of ``col``. Lines for a
    numeric ``x`` (or ``bandwidth``), bars for a categorical one (``kind`` forces either).
    Several rows at one (x, hue, col) are averaged."""
    require(df, x=x, y=y, hue=hue, col=col)
    df = select_rows(df, where)
    sns = _theme()
    data = df.copy()
    xcol = x
    if x == "bandwidth":
        data[_BW] = bandwidth_gbps(data)
        xcol = _BW
    numeric_x = _is_numeric(data[xcol])
    if kind == "auto":
        kind = "line" if numeric_x else "bar"
    data[y] = _to_numeric(data[y])
    data = _as_category(_as_category(data, hue), col)
    ncol = data[col].nunique() if col else 1
    facet = {
        "col": col,
        "col_wrap": min(ncol, 3) if col and ncol > 1 else None,
        "height": 3.4,
        "aspect": 1.35,
    }
    if kind == "line":
        if not numeric_x:
            raise ConfigError("x", x, "a line plot needs a numeric x column; use --kind bar")
        data[xcol] = _to_numeric(data[xcol])
        g = sns.relplot(
            data=data,
            x=xcol,
            y=y,
            hue=hue,
            kind="line",
            marker="o",
            errorbar=None,
            facet_kws={"sharey": False},
            **facet,
        )
        span = data[xcol].max() / max(data[xcol].min(), 1e-300)
        if logx if logx is not None else (data[xcol].min() > 0 and span >= 16):
            for ax in g.axes.flat:
                ax.set_xscale("log", base=2 if x == "gpus" else 10)
        ticks = sorted(data[xcol].dropna().unique())
        if len(ticks) <= 12:
            _set_xticks(g.axes.flat, ticks)
    elif kind == "bar":
        data = _as_category(data, xcol)
        g = sns.catplot(
            data=data, x=xcol, y=y, hue=hue, kind="bar", errorbar=None, sharey=False, **facet
        )
    else:
        raise ConfigError("kind", kind, f"choose one of: {', '.join(KINDS)}")
    g.set_axis_labels(label(x), label(y))
    if col:
        g.set_titles(col_template=f"{col} = {{col_name}}")
    if title:
        g.figure.suptitle(title, y=1.03)
    return g.figure


def _set_xticks(axes: Any, values: Sequence[float]) -> None:
    """Ticks exactly at ``values``, labelled as plain numbers (no 10^k, no minor ticks)."""
    from matplotlib.ticker import NullLocator

    for ax in axes:
        ax.set_xticks(list(values))
        ax.set_xticklabels([_fmt(float(f"{v:.4g}")) for v in values])
        ax.xaxis.set_minor_locator(NullLocator())


def speedup_plot(
    df: Any,
    *,
    hue: str | None = "scheme",
    col: str | None = None,
    where: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Any:
    """Speedup over one GPU against the number of GPUs, with the linear ideal dashed."""
    df = select_rows(df, where)
    col = col or _auto_col(df, ("model", "topology"))
    hue = hue if hue in df.columns else None
    fig = xy_plot(df, "gpus", "speedup", hue=hue, col=col, kind="line", title=title)
    from matplotlib.ticker import ScalarFormatter

    gpus = sorted(_to_numeric(df["gpus"]).dropna().unique())
    for ax in fig.axes:
        if ax.lines:
            ax.plot(gpus, gpus, linestyle="--", color="grey", linewidth=1, label="linear")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(ScalarFormatter())
            if ax.get_ylabel():
                ax.set_ylabel(label("speedup") + " (dashed: linear)")
    return fig


def throughput_plot(
    df: Any,
    *,
    hue: str | None = "scheme",
    col: str | None = None,
    where: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Any:
    """Throughput against inter-node bandwidth (Gbit/s, log axis)."""
    require(df, x="bandwidth")
    df = select_rows(df, where)
    col = col or _auto_col(df, ("model", "gpus", "topology"))
    hue = hue if hue in df.columns else None
    return xy_plot(
        df,
        "bandwidth",
        "throughput_samples_s",
        hue=hue,
        col=col,
        kind="line",
        logx=True,
        title=title,
    )


def _auto_col(df: Any, candidates: Sequence[str]) -> str | None:
    """The first of ``candidates`` that takes several values in ``df``."""
    for c in candidates:
        if c in df.columns and df[c].nunique() > 1:
            return c
    return None


def utilization_plot(
    df: Any,
    *,
    hue: str | None = None,
    col: str | None = None,
    where: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Any:
    """Utilisation of each GPU (rank on x). Each row is one configuration, labelled by the
    settings that differ between the selected rows unless ``hue`` is given."""
    import pandas as pd

    require(df, y="per_gpu_utilization", hue=hue, col=col)
    df = select_rows(df, where)
    varying = [c for c in swept_columns(df) if c not in (col,) and df[c].nunique() > 1]
    records = []
    for _, row in df.iterrows():
        util = row["per_gpu_utilization"]
        if isinstance(util, str):
            util = json.loads(util)
        name = row[hue] if hue else " ".join(f"{c}={_fmt(row[c])}" for c in varying)
        for rank, u in enumerate(util):
            rec = {"GPU": rank, "utilisation": 100 * float(u), "config": _fmt(name)}
            if col:
                rec[col] = row[col]
            records.append(rec)
    data = pd.DataFrame(records)
    sns = _theme()
    data = _as_category(data, col)
    many = data["GPU"].nunique() > 32
    facet = {
        "col": col,
        "col_wrap": min(data[col].nunique(), 3) if col else None,
        "height": 3.4,
        "aspect": 1.6,
    }
    use_hue = "config" if data["config"].nunique() > 1 or data["config"].iloc[0] else None
    if many:
        g = sns.relplot(
            data=data,
            x="GPU",
            y="utilisation",
            hue=use_hue,
            kind="line",
            errorbar=None,
            drawstyle="steps-mid",
            **facet,
        )
    else:
        g = sns.catplot(
            data=data, x="GPU", y="utilisation", hue=use_hue, kind="bar", errorbar=None, **facet
        )
    g.set_axis_labels("GPU rank", "utilisation (% of wall time busy)")
    for ax in g.axes.flat:
        ax.set_ylim(0, 105)
    if title:
        g.figure.suptitle(title, y=1.03)
    return g.figure


# ---- timelines ---------------------------------------------------------------------------


def read_chrome_trace(path: str) -> dict[str, Any]:
    """A Chrome trace file (``sim run --trace-out``); ``ConfigError`` if it is not one."""
    if not os.path.exists(path):
        raise ConfigError("TRACE", path, "does not exist")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        from traces.errors import unreadable

        raise ConfigError(
            "TRACE", path, f"is not a JSON Chrome trace ({' '.join(unreadable(exc).split())[:200]})"
        ) from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ConfigError(
            "TRACE",
            path,
            "is not a Chrome trace (no traceEvents list); make one with sim run --trace-out FILE",
        )
    return data


def gantt_plot(
    trace: Mapping[str, Any],
    *,
    where: Mapping[str, str] | None = None,
    title: str | None = None,
    ax: Any = None,
    xlabel: str = "simulated time (ms)",
) -> Any:
    """A timeline: one row per device and stream (lanes of one stream merged), one bar per
    slice, coloured by kind (forward, backward, send, allreduce...). ``where`` filters
    slices by ``device``, ``stream``, ``kind`` or ``iteration``. ``ax``: draw into these
    axes (e.g. one panel of a side-by-side figure) instead of a new figure; the figure is
    returned either way."""
    events = trace["traceEvents"]
    procs = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    threads = {
        (e["pid"], e["tid"]): str(e["args"]["name"]).split(" #")[0]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    allowed = {"device", "stream", "kind", "iteration"}
    for k in where or {}:
        if k not in allowed:
            raise ConfigError("where", k, f"a timeline filters by {', '.join(sorted(allowed))}")
    rows: dict[tuple[Any, str], dict[str, list[tuple[float, float]]]] = {}
    first_tid: dict[tuple[Any, str], Any] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        pid = e.get("pid")
        dev = str(procs.get(pid, pid))
        stream = threads.get((pid, e.get("tid")), str(e.get("tid")))
        kind = str(e.get("cat") or e.get("name"))
        it = e.get("args", {}).get("iteration", -1)
        attrs = {"device": dev, "stream": stream, "kind": kind, "iteration": str(it)}
        if any(attrs[k] != str(v) for k, v in (where or {}).items()):
            continue
        first_tid[pid, stream] = min(first_tid.get((pid, stream), e.get("tid", 0)), e.get("tid", 0))
        rows.setdefault((pid, stream), {}).setdefault(kind, []).append(
            (float(e["ts"]) / 1e3, float(e.get("dur", 0)) / 1e3)
        )
    if not rows:
        shown = " ".join(f"{k}={v}" for k, v in (where or {}).items()) or "(all)"
        raise ConfigError("where", shown, "selects no slices of the trace")
    from matplotlib.patches import Patch

    sns = _theme()
    plt = _pyplot()
    order = sorted(rows, key=lambda r: (r[0], first_tid[r]))
    kinds = list(dict.fromkeys(k for r in order for k in rows[r]))
    # the usual kinds keep one colour in every figure, so two timelines compare at a glance
    fixed = list(GANTT_KINDS) + [k for k in kinds if k not in GANTT_KINDS]
    colours = sns.color_palette("tab10" if len(fixed) <= 10 else "husl", len(fixed))
    palette = {k: colours[fixed.index(k)] for k in kinds}
    height = min(0.32 * len(order) + 1.4, 40.0)
    if ax is None:
        fig, ax = plt.subplots(figsize=(11, height))
    else:
        fig = ax.figure
    for i, r in enumerate(order):
        for kind, spans in rows[r].items():
            ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=palette[kind], linewidth=0)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"{procs.get(p, p)} {s}" for p, s in order])
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlabel(xlabel)
    ax.grid(axis="y", visible=False)
    ax.legend(
        handles=[Patch(color=palette[k], label=k) for k in kinds],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
    )
    meta = trace.get("otherData", {}).get("dtsim", {})
    if title is None and meta:
        title = (
            f"{meta.get('scheme')} | {meta.get('model')} | {meta.get('gpus')} GPUs | "
            f"{meta.get('topology')}"
        )
    if title:
        ax.set_title(title)
    return fig


# ---- output ------------------------------------------------------------------------------


def save_figure(fig: Any, path: str) -> None:
    """Write ``fig`` to ``path`` (``.png``, ``.svg`` or ``.pdf``) atomically and close it."""
    from traces.atomic import atomic_path

    suffix = os.path.splitext(path)[1].lower()
    if suffix not in FIGURE_SUFFIXES:
        raise ConfigError(
            "out", path, f"expected a file name ending in {', '.join(FIGURE_SUFFIXES)}"
        )
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ConfigError("out", path, f"its folder {d} does not exist")
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=130, bbox_inches="tight")
    finally:
        _pyplot().close(fig)


PREDICTION_COLUMNS = {
    "scaling_efficiency": ("real_scaling_efficiency", "predicted_scaling_efficiency"),
    "speedup": ("real_speedup", "predicted_speedup"),
    "iteration_time_s": ("real_iteration_time_s", "predicted_iteration_time_s"),
}
"""What ``--kind prediction`` draws (``--y``): measured and predicted columns of a
validation's results (``sim validate --device emulated``'s ``results.csv``)."""


def prediction_plot(
    df: Any,
    *,
    x: str | None = None,
    y: str | None = None,
    hue: str | None = "scheme",
    where: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Any:
    """Measured (solid) and predicted (dashed) ``y`` (scaling efficiency unless given:
    :data:`PREDICTION_COLUMNS`) against ``x`` (the ranks, or the bandwidth when the
    ranks do not vary), one colour per ``hue``; cases that were not counted (flagged,
    failed) are left out."""
    df = select_rows(df, where)
    y = y or "scaling_efficiency"
    if y not in PREDICTION_COLUMNS:
        raise ConfigError("y", y, f"choose one of: {', '.join(PREDICTION_COLUMNS)}")
    real, predicted = PREDICTION_COLUMNS[y]
    require(df, real=real, predicted=predicted)
    if "status" in df.columns:
        df = df[df["status"] == "ok"]
    if x is None:
        x = "gpus" if "gpus" in df.columns and df["gpus"].nunique() > 1 else "bandwidth"
    require(df, x=x)
    data = df.copy()
    xcol = x
    if x == "bandwidth":
        data[_BW] = bandwidth_gbps(data)
        xcol = _BW
    data[xcol] = _to_numeric(data[xcol])
    hue = hue if hue and hue in data.columns else None
    import pandas as pd

    keep = [xcol] + ([hue] if hue else [])
    long = pd.concat(
        [
            data[keep].assign(value=_to_numeric(data[real]), source="measured"),
            data[keep].assign(value=_to_numeric(data[predicted]), source="predicted"),
        ]
    )
    sns = _theme()
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sns.lineplot(
        data=long, x=xcol, y="value", hue=hue, style="source", markers=True,
        dashes={"measured": "", "predicted": (4, 2)}, errorbar=None, ax=ax,
    )  # fmt: skip
    ticks = sorted(long[xcol].dropna().unique())
    if x == "gpus" and ticks and ticks[-1] / max(ticks[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    if len(ticks) <= 12:
        _set_xticks([ax], ticks)
    ax.set_xlabel(label(x))
    ax.set_ylabel(y.replace("_", " ") + " (solid: measured, dashed: predicted)")
    if title:
        ax.set_title(title)
    return fig


def plot_results(
    path: str,
    kind: str = "auto",
    *,
    x: str | None = None,
    y: str | None = None,
    hue: str | None = None,
    col: str | None = None,
    where: Mapping[str, str] | None = None,
    title: str | None = None,
) -> Any:
    """The figure ``sim plot`` draws for results file (or, for ``gantt``, Chrome trace)
    ``path``; see :data:`KINDS`."""
    from analysis.store import read_table

    if kind not in KINDS:
        raise ConfigError("kind", kind, f"choose one of: {', '.join(KINDS)}")
    if kind == "gantt":
        return gantt_plot(read_chrome_trace(path), where=where, title=title)
    if path.lower().endswith(".json"):
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                head = fh.read(4096)
        except OSError:
            head = ""
        if '"traceEvents"' in head:
            raise ConfigError("kind", kind, f"{path} is a Chrome trace: plot it with --kind gantt")
    df = read_table(path)
    if kind == "speedup":
        return speedup_plot(df, hue=hue or "scheme", col=col, where=where, title=title)
    if kind == "throughput":
        return throughput_plot(df, hue=hue or "scheme", col=col, where=where, title=title)
    if kind == "utilization":
        return utilization_plot(df, hue=hue, col=col, where=where, title=title)
    if kind == "prediction":
        return prediction_plot(df, x=x, y=y, hue=hue or "scheme", where=where, title=title)
    if not x or not y:
        raise ConfigError(
            "x",
            x or "",
            "give --x and --y, or a ready --kind (speedup, throughput, utilization, gantt)",
        )
    return xy_plot(df, x, y, hue=hue, col=col, kind=kind, where=where, title=title)


__all__ = [
    "KINDS",
    "gantt_plot",
    "plot_results",
    "prediction_plot",
    "save_figure",
    "speedup_plot",
    "throughput_plot",
    "utilization_plot",
    "xy_plot",
]
