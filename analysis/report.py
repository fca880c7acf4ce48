"""``sim report``: the seed papers' comparisons, run on the simulator, as Markdown.

Each :class:`Section` names the schemes its comparison needs (baseline first) and the
sweep that makes it; the section runs with whichever of them exist in
:func:`simcore.schemes.registry` at run time and says which are missing, so the report
fills in by itself as schemes land. The partitioner section uses :mod:`simcore.partition`
(see :func:`run_partitioner`).

Output folder: ``report.md``, ``figures/*.png`` and ``data/*.csv`` (one sweep output per
section; a rerun computes only what is missing, and ``sim plot`` can redraw from them).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.plots import save_figure, throughput_plot, xy_plot
from analysis.sweep import plan_sweep, run_sweep
from simcore.spec import FLAG_FIELDS

PAPER_MODELS = (
    "vgg16",
    "resnet18",
    "resnet50",
    "resnet101",
    "alexnet",
    "resnext50",
    "resnext101",
    "inception_v3",
    "densenet121",
    "squeezenet1_0",
)
"""The antichain paper's ten models (built-in PipeDream profiles)."""

PAPER_PARTITION_S = {
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
"""The antichain paper's Table 1: its partitioner's run time (s) per (model, GPUs), for
the models docs/schemes.md, section 9 quotes."""


def pipeline_schemes() -> tuple[str, ...]:
    """The registered schemes that run a pipeline schedule, in display order."""
    from simcore.schemes import registry
    from simcore.schemes._pipeline import PipelineScheme

    return tuple(n for n, cls in registry().items() if issubclass(cls, PipelineScheme))


@dataclass(frozen=True)
class Section:
    """One comparison of the report.

    Attributes:
        key: file stem of its data and figure.
        title: heading.
        claim: what the paper says (the thing reproduced).
        schemes: schemes compared, baseline first.
        setup: one sentence on the simulated set-up.
        base: settings every point shares (RunSpec field names).
        axes: ``quick -> {field: values}`` without ``scheme`` (added from ``schemes``).
        figure: ``(rows) -> Figure``.
        table: ``(rows, schemes present) -> Markdown``.
    """

    key: str
    title: str
    claim: str
    schemes: tuple[str, ...]
    setup: str
    base: Mapping[str, Any]
    axes: Callable[[bool], dict[str, tuple[Any, ...]]]
    figure: Callable[[Any], Any]
    table: Callable[[Any, Sequence[str]], str]
    needs_all: bool = field(default=True)


# ---- Markdown helpers ------------------------------------------------------------------


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (numbers right-aligned)."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|")

    numeric = [all(_numberlike(r[i]) for r in rows) and rows for i in range(len(header))]
    out = [
        "| " + " | ".join(map(cell, header)) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def _numberlike(v: Any) -> bool:
    s = str(v).rstrip("%x").replace(",", "").lstrip("+-")
    try:
        float(s)
    except ValueError:
        return s in ("", "-")
    return True


def _num(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}"


def sweep_command(base: Mapping[str, Any], axes: Mapping[str, Sequence[Any]], out: str) -> str:
    """The ``sim sweep`` command line that runs the same points."""
    parts = ["sim sweep"]
    settings = {**{k: (v,) for k, v in base.items()}, **axes}
    for k, vals in settings.items():
        text = ",".join(str(v) for v in vals)
        if k in FLAG_FIELDS:
            parts.append(f"--{k.replace('_', '-')} {text}")
        else:
            parts.append(f"--set {k}={text}")
    parts.append(f"--out {out}")
    return " ".join(parts)


def _value(df: Any, where: Mapping[str, Any], col: str) -> float:
    sel = df
    for k, v in where.items():
        sel = sel[sel[k].astype(str) == str(v)]
    return float(sel[col].iloc[0]) if len(sel) else float("nan")


# ---- the sections ------------------------------------------------------------------------

_BANDWIDTHS = ("1Gbps", "2Gbps", "4Gbps", "6Gbps", "8Gbps", "10Gbps", "15Gbps", "20Gbps", "30Gbps")


def _p3_table(df: Any, present: Sequence[str]) -> str:
    rows = []
    for model in dict.fromkeys(df["model"]):
        for bw in dict.fromkeys(df["bandwidth"]):
            ps = _value(
                df, {"model": model, "bandwidth": bw, "scheme": "ps"}, "throughput_samples_s"
            )
            p3 = _value(
                df, {"model": model, "bandwidth": bw, "scheme": "p3"}, "throughput_samples_s"
            )
            gain = f"{100 * (p3 / ps - 1):+.0f}%" if ps > 0 and p3 == p3 else "-"
            rows.append((model, bw, _num(ps), _num(p3), gain))
    return md_table(("model", "bandwidth", "ps (samples/s)", "p3 (samples/s)", "P3 gain"), rows)


def _gossip_figure(df: Any) -> Any:
    df = df.copy()
    df["scaling_efficiency"] = df["speedup"] / df["gpus"]
    return xy_plot(df, "gpus", "scaling_efficiency", hue="scheme", kind="line", logx=True)


def _gossip_table(df: Any, present: Sequence[str]) -> str:
    rows = []
    for g in sorted(df["gpus"].unique()):
        row: list[Any] = [int(g)]
        for s in present:
            sp = _value(df, {"gpus": g, "scheme": s}, "speedup")
            row += [_num(sp), f"{100 * sp / g:.1f}%" if sp == sp else "-"]
        rows.append(row)
    header = ["GPUs"] + [h for s in present for h in (f"{s} speedup", f"{s} efficiency")]
    return md_table(header, rows)


def _vs_baseline_table(df: Any, present: Sequence[str], across: str) -> str:
    base = present[0]
    rows = []
    for v in dict.fromkeys(df[across]):
        b = _value(df, {across: v, "scheme": base}, "throughput_samples_s")
        row: list[Any] = [v]
        for s in present:
            t = _value(df, {across: v, "scheme": s}, "throughput_samples_s")
            row.append(_num(t) + ("" if s == base or not b > 0 or t != t else f" ({t / b:.2f}x)"))
        rows.append(row)
    return md_table([across] + [f"{s} (samples/s)" for s in present], rows)


def _zero_bubble_table(df: Any, present: Sequence[str]) -> str:
    """Per model: each schedule's throughput (and its ratio to the first, 1F1B) and its
    peak memory per GPU."""
    base = present[0]
    rows = []
    for model in dict.fromkeys(df["model"]):
        b = _value(df, {"model": model, "scheme": base}, "throughput_samples_s")
        row: list[Any] = [model]
        for s in present:
            t = _value(df, {"model": model, "scheme": s}, "throughput_samples_s")
            mem = _value(df, {"model": model, "scheme": s}, "peak_memory_bytes") / 2**30
            ratio = "" if s == base or not b > 0 or t != t else f" ({t / b:.2f}x)"
            row.append(f"{_num(t)}{ratio}, {_num(mem, 2)} GiB")
        rows.append(row)
    return md_table(["model"] + [f"{s} (samples/s, peak memory)" for s in present], rows)


def _scheme_bars(df: Any, across: str | None) -> Any:
    return xy_plot(df, "scheme", "throughput_samples_s", col=across, kind="bar")


def _overview_table(df: Any, present: Sequence[str]) -> str:
    rows = []
    for _, r in df.iterrows():
        rows.append(
            (
                r["scheme"],
                _num(r["throughput_samples_s"]),
                _num(r["speedup"], 2),
                f"{100 * r['gpu_utilization']:.1f}%",
                _num(r["peak_memory_bytes"] / 2**30, 2),
                "yes" if _truthy(r.get("fits_in_memory")) else "no",
                _num(r["comm_bytes_per_iteration"] / 2**20, 1),
            )
        )
    return md_table(
        (
            "scheme",
            "throughput (samples/s)",
            "speedup",
            "GPU utilisation",
            "peak memory (GiB)",
            "fits in GPU memory",
            "sent per iteration (MiB)",
        ),
        rows,
    )


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("true", "1", "1.0")


def sections() -> list[Section]:
    """The report's sections, in order. Schemes come from the registry at call time."""
    from simcore.schemes import registry

    every = tuple(registry())
    return [
        Section(
            key="all-schemes",
            title="Every scheme at a glance",
            claim="Not a paper's claim: one common configuration for every scheme that "
            "exists, so that a new scheme shows up here first.",
            schemes=every,
            needs_all=False,
            setup="ResNet-50, 4 GPUs in one PCIe box (preset pcie), batch per replica as profiled.",
            base={"topology": "pcie", "gpus": 4, "model": "resnet50"},
            axes=lambda quick: {"iterations": (2 if quick else 3,)},
            figure=lambda df: _scheme_bars(df, None),
            table=_overview_table,
        ),
        Section(
            key="p3-vs-ps",
            title="P3 against the parameter server across bandwidths",
            claim="P3 (priority-based parameter propagation) raises throughput over the "
            "MXNet parameter server by 25% for ResNet-50, 38% for Sockeye and 66% "
            "for VGG-19 at limited bandwidth; the gain grows as bandwidth shrinks "
            "until compute no longer hides anything.",
            schemes=("ps", "p3"),
            setup="4 hosts with one V100 each on one Ethernet switch (preset ethernet), "
            "link rate swept; GNMT stands in for Sockeye and VGG-16 for VGG-19.",
            base={"topology": "ethernet", "gpus": 4},
            axes=lambda quick: {
                "model": ("resnet50",) if quick else ("resnet50", "vgg16", "gnmt"),
                "bandwidth": ("1Gbps", "10Gbps") if quick else _BANDWIDTHS,
                "iterations": (2 if quick else 3,),
            },
            figure=lambda df: throughput_plot(df, col="model"),
            table=_p3_table,
        ),
        Section(
            key="gossip-vs-allreduce",
            title="GossipGraD against all-reduce, 8 to 1024 GPUs",
            claim="GossipGraD keeps about 100% compute efficiency for ResNet-50 on 128 P100 "
            "GPUs over InfiniBand: one partner per step, O(1) messages per worker, "
            "where a ring all-reduce pays 2(p-1) latency terms.",
            schemes=("dp", "gossip"),
            setup="ResNet-50 on 4-GPU P100 nodes joined by InfiniBand EDR (preset "
            "ib-cluster), analytic network model; efficiency = speedup / GPUs.",
            base={"topology": "ib-cluster", "model": "resnet50", "fidelity": "analytic"},
            axes=lambda quick: {
                "gpus": (8, 16) if quick else tuple(2**k for k in range(3, 11)),
                "iterations": (1 if quick else 2,),
            },
            figure=_gossip_figure,
            table=_gossip_table,
        ),
        Section(
            key="pipelines-vs-dp",
            title="Pipeline schemes against data parallelism, 4 GPUs",
            claim="SpecTrain: up to 8.91x the throughput of data parallelism on 4 GPUs; the "
            "antichain paper: GPipe with its partition reaches speedup 3.4 on 4 GPUs; "
            "naive model parallelism keeps one GPU busy at a time.",
            schemes=("dp", *pipeline_schemes()),
            needs_all=False,
            setup="4 GPUs in one PCIe box (preset pcie): a convolutional (VGG-16), a "
            "fully-connected-heavy (AlexNet) and a recurrent (GNMT) model.",
            base={"topology": "pcie", "gpus": 4},
            axes=lambda quick: {
                "model": ("alexnet",) if quick else ("vgg16", "alexnet", "gnmt"),
                "iterations": (2 if quick else 3,),
            },
            figure=lambda df: _scheme_bars(df, "model"),
            table=lambda df, present: _vs_baseline_table(df, present, "model"),
        ),
        Section(
            key="zero-bubble",
            title="Zero-bubble schedules against 1F1B and interleaved 1F1B, 4 GPUs",
            claim="The zero-bubble paper: splitting the backward into input- and "
            "weight-gradient passes, ZB-H1 cuts 1F1B's bubble to about a third at 1F1B's "
            "peak memory, and ZB-V removes it at 1F1B's memory; DualPipeV (DeepSeek) and "
            "ZB-V are compared with interleaved 1F1B on two chunks per GPU.",
            schemes=("1f1b", "zb-h1", "interleaved", "zb-interleaved", "zbv", "dualpipev"),
            setup="4 GPUs in one PCIe box (preset pcie), the seed models, automatic "
            "micro-batches (four per GPU); interleaved schedules on two chunks per GPU.",
            base={"topology": "pcie", "gpus": 4},
            axes=lambda quick: {
                "model": ("gnmt",) if quick else ("vgg16", "alexnet", "gnmt", "resnet50"),
                "iterations": (2 if quick else 3,),
            },
            figure=lambda df: _scheme_bars(df, "model"),
            table=_zero_bubble_table,
        ),
    ]


# ---- the partitioner ---------------------------------------------------------------------


PARTITION_BANDWIDTH_BYTES_PER_S = 1.25e9
"""10 Gbps between stages, the setting of PipeDream's and the antichain paper's comparisons."""


def run_partitioner(model: str, gpus: int) -> dict[str, Any]:
    """Partition ``model`` over ``gpus`` GPUs with the antichain partitioner
    (:func:`simcore.partition.partition`, replicated stages allowed, 10 Gbps) and summarise
    the balance: stages, replicas, bottleneck, max/mean stage compute, its run time."""
    from analysis.resolve import resolve_trace
    from simcore.partition import partition

    result = partition(resolve_trace(model), gpus, PARTITION_BANDWIDTH_BYTES_PER_S)
    compute = [s.compute_s for s in result.stages]
    mean = sum(compute) / len(compute)
    return {
        "model": model,
        "gpus": gpus,
        "stages": len(result.stages),
        "replicas": sum(s.replicas for s in result.stages),
        "bottleneck_s": result.bottleneck_s,
        "imbalance": max(compute) / mean if mean > 0 else math.nan,
        "speedup_vs_1gpu": result.speedup_vs_1gpu,
        "partition_s": result.wall_s,
        "paper_partition_s": PAPER_PARTITION_S.get((model, gpus), math.nan),
    }


def partition_section(out_dir: str, quick: bool) -> str:
    """The partitioner's balance for the paper's ten models on 4 and 8 GPUs (Markdown)."""
    import pandas as pd

    head = (
        "## The antichain partitioner's balance, ten models on 4 and 8 GPUs\n\n"
        "*Paper:* the antichain DAG partitioner balances the stages of VGG-16, "
        "ResNet-18/50/101, AlexNet, ResNeXt-50/101, Inception-v3, DenseNet-121 and "
        "SqueezeNet on 4 and 8 GPUs, and partitions each in at most a few seconds "
        "(its Table 1).\n\n"
        "*Here:* `sim partition --model M --gpus G --bandwidth 10Gbps` for each.\n\n"
    )
    _make_dirs(out_dir)
    models = PAPER_MODELS[:2] if quick else PAPER_MODELS
    wanted = [(m, g) for m in models for g in (4, 8)]
    data = os.path.join(out_dir, "data", "partitioner-balance.csv")
    # Like the simulated sections, a rerun reuses what data/ already holds.
    old = pd.read_csv(data) if os.path.exists(data) else None
    if old is not None and set(wanted) <= set(zip(old["model"], old["gpus"], strict=True)):
        rows = [old[(old["model"] == m) & (old["gpus"] == g)].iloc[0].to_dict() for m, g in wanted]
    else:
        rows = [run_partitioner(m, g) for m, g in wanted]
    df = pd.DataFrame(rows)
    df.to_csv(data, index=False)
    fig = xy_plot(df, "model", "imbalance", hue="gpus", kind="bar")
    save_figure(fig, os.path.join(out_dir, "figures", "partitioner-balance.png"))
    table = md_table(
        (
            "model",
            "GPUs",
            "stages",
            "replicas",
            "bottleneck (ms)",
            "imbalance (max/mean stage)",
            "predicted speedup",
            "time (s)",
            "paper's time (s)",
        ),
        [
            (
                r["model"],
                r["gpus"],
                r["stages"],
                r["replicas"],
                _num(1e3 * r["bottleneck_s"], 2),
                _num(r["imbalance"], 2),
                _num(r["speedup_vs_1gpu"], 2),
                _num(r["partition_s"], 3),
                _num(r["paper_partition_s"], 2),
            )
            for r in rows
        ],
    )
    return (
        head
        + "![partitioner balance](figures/partitioner-balance.png)\n\n"
        + table
        + "\n\nImbalance 1.00 means perfectly equal stage compute times; a stage "
        "replicated r times counts its compute once (each replica runs 1/r of the "
        "micro-batches).\n"
    )


# ---- the report ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportSummary:
    """What :func:`build_report` did: the Markdown path, the comparisons it could not
    make in full (title -> what is missing), points computed now and seconds taken."""

    path: str
    missing: Mapping[str, str]
    computed: int
    wall_s: float


def _make_dirs(out_dir: str) -> None:
    for sub in ("figures", "data"):
        os.makedirs(os.path.join(out_dir, sub), exist_ok=True)


def run_section(
    sec: Section, out_dir: str, quick: bool, jobs: int, progress: bool
) -> tuple[str, str, int]:
    """Run one section's sweep; returns ``(markdown, what is missing, points computed)``."""
    from simcore.schemes import registry

    reg = registry()
    present = tuple(s for s in sec.schemes if s in reg)
    absent = tuple(s for s in sec.schemes if s not in reg)
    missing = ", ".join(absent)
    text = [f"## {sec.title}\n", f"*Paper:* {sec.claim}\n", f"*Set-up:* {sec.setup}\n"]
    if not present:
        text.append(f"**Cannot be made yet:** no scheme of {', '.join(sec.schemes)} exists.\n")
        return "\n".join(text), missing or "all", 0
    from simcore.spec import RunSpec, apply_settings

    _make_dirs(out_dir)
    axes = {"scheme": present, **sec.axes(quick)}
    data = os.path.join(out_dir, "data", f"{sec.key}.csv")
    plan = plan_sweep(apply_settings(RunSpec(), sec.base), axes)
    summary = run_sweep(plan, data, jobs=jobs, progress=progress)
    from analysis.store import read_table

    df = read_table(data)
    order = {p.point_id: i for i, p in enumerate(plan.points)}
    df = df[df["point_id"].isin(order)]
    df = df.iloc[df["point_id"].map(order).argsort()]
    failed = df[df["status"] != "ok"]
    df = df[df["status"] == "ok"]
    text.append("Reproduce: `" + sweep_command(sec.base, axes, f"data/{sec.key}.csv") + "`\n")
    if len(df):
        save_figure(sec.figure(df), os.path.join(out_dir, "figures", f"{sec.key}.png"))
        text.append(f"![{sec.title}](figures/{sec.key}.png)\n")
        text.append(sec.table(df, [s for s in present if s in set(df["scheme"])]) + "\n")
    for _, r in failed.iterrows():
        text.append(f"- failed: {r['scheme']} {r.get('model', '')}: {r['error']}")
    if failed.shape[0]:
        text.append("")
    if absent:
        text.append(
            f"**Not yet in this build:** {missing}; "
            + (
                "the comparison itself cannot be made until "
                f"{'it exists' if len(absent) == 1 else 'they exist'}."
                if sec.needs_all
                else "these rows will appear once they exist."
            )
            + "\n"
        )
    return "\n".join(text), missing, summary.computed


def build_report(
    out_dir: str,
    *,
    quick: bool = False,
    jobs: int = 1,
    progress: bool = False,
    extra_sections: Sequence[str] = (),
) -> ReportSummary:
    """Run every section and write ``out_dir/report.md`` with its figures and data;
    ``extra_sections`` (Markdown) follow them (``sim report --emulated``'s, from
    :func:`analysis.emulated_report.emulated_section`)."""
    from simcore.schemes import ORDER, registry
    from simcore.version import __version__

    t0 = time.perf_counter()
    _make_dirs(out_dir)
    parts: list[str] = []
    missing: dict[str, str] = {}
    computed = 0
    for sec in sections():
        text, miss, n = run_section(sec, out_dir, quick, jobs, progress)
        parts.append(text)
        computed += n
        if miss:
            missing[sec.title] = miss
    parts.append(partition_section(out_dir, quick))
    from analysis.convergence import report_section

    conv = report_section(out_dir, quick)
    parts.append(conv)
    parts.extend(extra_sections)

    reg = registry()
    absent = [s for s in ORDER if s not in reg]
    head = [
        "# dtsim report: the seed papers' comparisons on the simulator\n",
        f"Made by `sim report{' --quick' if quick else ''}` with dtsim {__version__}. "
        f"Schemes in this build: {', '.join(reg)}"
        + (f"; not yet: {', '.join(absent)}" if absent else "")
        + ".\n",
        "Every number is simulated; the data behind each figure is in `data/` (plot it "
        "again with `sim plot data/FILE.csv ...`).\n",
        "## Coverage\n",
        md_table(
            ("comparison", "status"),
            [
                (
                    sec.title,
                    f"missing: {missing[sec.title]}" if sec.title in missing else "complete",
                )
                for sec in sections()
            ]
            + [
                ("The antichain partitioner's balance", "complete"),
                (
                    "Convergence under staleness and time to accuracy",
                    "missing: torch or scikit-learn" if "*Not run:*" in conv else "complete",
                ),
            ],
        )
        + "\n",
    ]
    if quick:
        head.insert(
            2, "*Quick mode:* fewer models, bandwidths and GPU counts than the full report.\n"
        )
    from traces.atomic import atomic_path

    path = os.path.join(out_dir, "report.md")
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(head) + "\n" + "\n".join(parts))
    return ReportSummary(
        path=path, missing=missing, computed=computed, wall_s=time.perf_counter() - t0
    )


__all__ = [
    "PAPER_MODELS",
    "ReportSummary",
    "Section",
    "build_report",
    "md_table",
    "run_partitioner",
    "sections",
    "sweep_command",
]
