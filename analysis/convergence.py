"""Convergence under staleness and time to accuracy.

:func:`training_job` turns the convergence settings (model, scheme, GPUs, epochs, samples
per update, learning rate, momentum, seed) into the :class:`~realrun.job.Job` that both
the staleness emulator (:func:`realrun.emulate.emulate`) and the multi-process runtime
(``sim train --real``) run; :func:`train` runs a grid of them and gathers per-epoch
curves (with the gossip workers' disagreement); :func:`paper_table` and :func:`to_target`
summarise them, :func:`plot_disagreement` draws the disagreement; :func:`time_to_accuracy`
multiplies the updates a scheme needs to reach a target accuracy by ``sim run``'s
iteration time for the same model, scheme and GPUs on a cluster the user names.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@functools.cache
def _study() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every convergence scheme's real scheme and options, from the scheme classes'
    ``convergence_variants``, in ``sim schemes`` order. A class's variants are its own: a
    subclass (a user's variant of ``dp``) does not inherit its base's names, which would
    take them over."""
    from simcore.schemes import registry

    return {
        variant: (name, dict(options))
        for name, cls in registry().items()
        for variant, options in vars(cls).get("convergence_variants", {}).items()
    }


CONVERGENCE_SCHEMES = tuple(_study())
"""Schemes ``sim train`` compares, as their classes name them (``convergence_variants``):
``vanilla`` is ``pipedream`` with ``stash=false``; ``gossip`` averages weights and
momentum (the authors' final exchange), ``gossip-X`` is ``gossip`` with ``exchange=X``
(:data:`GOSSIP_VARIANTS`)."""

GOSSIP_VARIANTS = {
    variant: options["exchange"]
    for variant, (name, options) in _study().items()
    if name == "gossip" and "exchange" in options
}
"""Convergence names of gossip's other exchanges (:data:`simcore.schemes.gossip.EXCHANGES`)."""

DIGITS_MODELS = ("digits_cnn", "digits_mlp", "digits_lstm", "digits_transformer")
"""The zoo's models of the paper's four families sized for the digits data."""


@dataclass(frozen=True)
class TrainSettings:
    """The settings of ``sim train`` and the README's convergence study, declared once.

    Attributes:
        models: zoo models (the digits models of the paper's four families).
        schemes: convergence schemes (:data:`CONVERGENCE_SCHEMES`).
        seeds: each seeds the split, the initial weights and the data order.
        gpus: workers of the data-parallel schemes, stages of the pipelines.
        epochs: passes over the training split.
        batch: samples per weight update, over all workers.
        lr: learning rate of SGD with momentum.
        model_lr: learning rates of models that need another (the LSTM learns slowly at
            the others' rate).
        momentum: its momentum.
        target_accuracy: validation accuracy (0-1) for epochs and time to target.
        topology: the cluster of ``sim run`` for time to accuracy.
    """

    models: tuple[str, ...] = DIGITS_MODELS
    schemes: tuple[str, ...] = CONVERGENCE_SCHEMES
    seeds: tuple[int, ...] = (0,)
    gpus: int = 4
    epochs: int = 8
    batch: int = 32
    lr: float = 0.02
    model_lr: tuple[tuple[str, float], ...] = (("digits_lstm", 0.1),)
    momentum: float = 0.9
    target_accuracy: float = 0.95
    topology: str = "pcie"


def scheme_of(name: str) -> tuple[str, dict[str, Any]]:
    """The real scheme and options of a convergence scheme name (``vanilla`` is PipeDream
    without stashing; the asynchronous pipelines are straight: one GPU per stage)."""
    study = _study()
    if name not in study:
        raise ValueError(
            f"scheme: {name!r} is not allowed; choose from: {', '.join(CONVERGENCE_SCHEMES)}"
        )
    real, options = study[name]
    return real, dict(options)


def training_job(
    model: str,
    scheme: str,
    gpus: int = 4,
    epochs: int = 1,
    batch: int = 32,
    lr: float = 0.05,
    momentum: float = 0.9,
    seed: int = 0,
    dataset: str = "digits",
) -> Any:
    """The job of ``epochs`` epochs of convergence scheme ``scheme`` (see
    :data:`CONVERGENCE_SCHEMES`) on ``gpus`` ranks, ``batch`` samples per weight update
    (:mod:`realrun.data`; :func:`realrun.job.job_from_spec`); a pipeline's stages are those
    ``sim run`` would use (:func:`analysis.resolve.zoo_config`)."""
    from analysis.resolve import zoo_config
    from realrun import data
    from realrun.job import Job, job_from_spec
    from simcore.schemes import get_scheme

    real, options = scheme_of(scheme)
    if gpus < 1:
        raise ValueError(f"gpus: {gpus} is not allowed; give 1 or more")
    cls = get_scheme(real)
    per_rank = batch // gpus
    if cls.pipeline:
        feat = cls.features
        per_rank = batch
        if cls.update_per_microbatch:  # an update per micro-batch: one per stage
            options["microbatches"] = gpus
            per_rank = batch * gpus
        elif not feat.microbatches:  # the scheme's own count, cut to divide the batch
            options["microbatches"] = math.gcd(batch, feat.microbatches_per_stage * gpus)
    job = job_from_spec(
        real,
        gpus,
        options,
        plan_config=lambda opts: zoo_config(model, per_rank, gpus, real, opts, "momentum"),
        model=model,
        batch_size=per_rank,
        iterations=1,
        warmup_iterations=0,
        seed=seed,
        optimizer="momentum",
        momentum=momentum,
        lr=lr,
        data=dataset,
    )
    if cls.pipeline and len(job.pipeline["stage_layers"]) != gpus:
        raise ValueError(
            f"gpus: {gpus} is not allowed for {model}; its layers make only "
            f"{len(job.pipeline['stage_layers'])} stages"
        )
    if not cls.pipeline and batch % gpus:
        raise ValueError(
            f"batch: {batch} is not allowed with {gpus} data-parallel workers; give a "
            f"multiple of {gpus}"
        )
    u = data.updates_per_epoch(job)
    k = data.updates_per_iteration(job)
    d = job.to_dict()
    d["iterations"] = -(-epochs * u // k)
    return Job.from_dict(d)


# ---- running a grid ---------------------------------------------------------------------

CURVE_COLUMNS = (
    "model",
    "scheme",
    "seed",
    "epoch",
    "updates",
    "samples",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "disagreement",
)
"""Columns of the per-epoch curves :func:`train` returns (``disagreement``: gossip's,
:func:`realrun.emulate.disagreement`; empty for the other schemes)."""


def same_numerics(name: str) -> bool:
    """Whether convergence scheme ``name`` trains by SGD on the whole update batch (its
    class's ``same_numerics``), as the emulator trains every such scheme."""
    from simcore.schemes import get_scheme

    return bool(get_scheme(scheme_of(name)[0]).same_numerics)


SAME_NUMERICS = tuple(n for n in CONVERGENCE_SCHEMES if same_numerics(n))
"""The convergence schemes whose training is SGD on the whole update batch
(:func:`same_numerics`): the emulator trains the first of them asked for once and gives
the others its curves."""


def train(
    models: Sequence[str],
    schemes: Sequence[str],
    seeds: Sequence[int],
    gpus: int = TrainSettings.gpus,
    epochs: int = TrainSettings.epochs,
    batch: int = TrainSettings.batch,
    lr: float | Mapping[str, float] = TrainSettings.lr,
    momentum: float = TrainSettings.momentum,
    real: bool = False,
    workdir: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> Any:
    """Per-epoch curves (a DataFrame with :data:`CURVE_COLUMNS`) of every model x scheme x
    seed, from the staleness emulator, or with ``real`` from multi-process runs (in
    ``workdir``; see :func:`real_curves`). ``lr`` is one learning rate or one per model.
    ``progress`` is called with the epochs done."""
    import pandas as pd
    import torch

    from realrun.emulate import emulate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and leaves the rest
    rows: list[dict[str, Any]] = []
    try:
        for model in models:
            rate = lr[model] if isinstance(lr, Mapping) else lr
            for seed in seeds:
                shared: list[dict[str, float]] | None = None
                for scheme in schemes:
                    head = {"model": model, "scheme": scheme, "seed": seed}
                    if not real and scheme in SAME_NUMERICS and shared is not None:
                        rows += [{**head, **r} for r in shared]
                        if progress:
                            progress(epochs)
                        continue
                    job = training_job(model, scheme, gpus, epochs, batch, rate, momentum, seed)
                    if real:
                        got = real_curves(job, epochs, workdir, progress)
                    else:
                        got = emulate(
                            job, epochs, on_epoch=(lambda _r: progress(1)) if progress else None
                        ).epochs
                        if scheme in SAME_NUMERICS:
                            shared = got
                    rows += [{**head, **r} for r in got]
    finally:
        torch.set_num_threads(threads)
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


def real_curves(
    job: Any,
    epochs: int,
    workdir: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """The curves of one multi-process run of ``job``: every worker keeps its weights at
    every epoch's end (a pipeline's ranks their stage's), which are put together and
    evaluated (for ``gossip``, worker 0's, and the workers' disagreement); the training
    loss is the mean of the losses the run computed in the epoch (a pipeline's last
    stage's per micro-batch, the workers' per batch)."""
    import dataclasses
    import math
    import os
    import tempfile

    import torch

    from realrun import data
    from realrun.emulate import disagreement, evaluator
    from realrun.launch import launch
    from simcore.schemes import get_scheme

    job = dataclasses.replace(job, save_weights=True, record_layers=False)
    ev = evaluator(job)
    u = data.updates_per_epoch(job)
    b = data.update_batch(job)
    with tempfile.TemporaryDirectory(dir=workdir) as out:
        records = launch(job, out)
        weights: dict[int, dict[str, Any]] = {}
        every: dict[int, list[dict[str, Any]]] = {}  # gossip: each worker's
        losses: dict[int, list[float]] = {}
        per = data.updates_per_iteration(job)
        m = int(job.pipeline.get("microbatches", 1))
        cls = get_scheme(job.scheme)
        for r in records["ranks"]:
            if r["rank"] >= job.workers:
                continue
            path = os.path.join(out, f"epoch-weights-rank{r['rank']}.pt")
            for e, w in torch.load(path).items():
                # a worker's own weights (gossip: worker 0's, as the emulator evaluates)
                if cls.pipeline or r["rank"] == 0:
                    weights.setdefault(e, {}).update(w)
                if cls.replicas_diverge:
                    every.setdefault(e, []).append(w)
            for step, loss in r.get("losses", []):
                # pipelines: per micro-batch; the others: per iteration (= update)
                upd = step if per > 1 or not cls.pipeline else step // m
                losses.setdefault(int(upd) // u, []).append(loss)
        rows = []
        for e in range(1, epochs + 1):
            vl, va = ev(weights[e])
            tl = losses.get(e - 1, [])
            rows.append(_row(e, u, b, sum(tl) / len(tl) if tl else math.nan, vl, va))
            if cls.replicas_diverge:
                rows[-1]["disagreement"] = disagreement(every[e])
            if progress:
                progress(1)
    return rows


def _row(e: int, u: int, b: int, tl: float, vl: float, va: float) -> dict[str, float]:
    return {
        "epoch": e,
        "updates": e * u,
        "samples": e * u * b,
        "train_loss": tl,
        "val_loss": vl,
        "val_accuracy": va,
    }


# ---- summaries --------------------------------------------------------------------------


def paper_table(curves: Any) -> Any:
    """The SpecTrain paper's table: per model and scheme, the minimum training loss, the
    minimum validation loss and the maximum validation accuracy over the epochs, as mean
    and sample standard deviation (``n - 1``; NaN for one seed) over the seeds (``seeds``
    says how many)."""
    per_seed = curves.groupby(["model", "scheme", "seed"], sort=False).agg(
        min_train_loss=("train_loss", "min"),
        min_val_loss=("val_loss", "min"),
        max_val_accuracy=("val_accuracy", "max"),
    )
    g = per_seed.groupby(level=["model", "scheme"], sort=False)
    out = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_std"))
    out["seeds"] = g.size()
    return out.reset_index()


def to_target(curves: Any, target: float) -> Any:
    """Per model, scheme and seed, the first epoch whose validation accuracy reaches
    ``target`` (0-1), and the updates and samples until then (NaN: never reached)."""
    import pandas as pd

    rows = []
    for (model, scheme, seed), g in curves.groupby(["model", "scheme", "seed"], sort=False):
        hit = g[g["val_accuracy"] >= target].sort_values("epoch").head(1)
        rows.append(
            {
                "model": model,
                "scheme": scheme,
                "seed": seed,
                "target": target,
                "epoch": float(hit["epoch"].iloc[0]) if len(hit) else math.nan,
                "updates": float(hit["updates"].iloc[0]) if len(hit) else math.nan,
                "samples": float(hit["samples"].iloc[0]) if len(hit) else math.nan,
            }
        )
    return pd.DataFrame(rows)


def merge_same(df: Any) -> Any:
    """``df`` (with a ``scheme`` column) with the schemes of :data:`SAME_NUMERICS` whose
    numbers equal the first's dropped and the first named ``dp (= ps, p3, mp, gpipe)``:
    the emulator gives them the same curves by construction (real runs are merged only
    where their numbers agree exactly)."""
    import numpy as np

    present = [s for s in SAME_NUMERICS if s in set(df["scheme"])]
    if len(present) < 2:
        return df
    numeric = [c for c in df.columns if c != "scheme" and df[c].dtype.kind == "f"]

    def values(s: str) -> Any:
        return df[df["scheme"] == s][numeric].to_numpy()

    first = values(present[0])
    same = [present[0]] + [
        s
        for s in present[1:]
        if values(s).shape == first.shape
        and np.allclose(values(s), first, rtol=0, atol=1e-9, equal_nan=True)
    ]
    if len(same) < 2:
        return df
    label = f"{same[0]} (= {', '.join(same[1:])})"
    return df[~df["scheme"].isin(same[1:])].replace({"scheme": {same[0]: label}})


def markdown_table(table: Any) -> str:
    """:func:`paper_table`'s output as Markdown, ``mean ± std`` per cell (the mean alone
    for one seed; the schemes with identical curves in one row, :func:`merge_same`)."""
    lines = [
        "| model | scheme | min train loss | min val loss | max val accuracy | seeds |",
        "|---|---|---:|---:|---:|---:|",
    ]

    def spread(sd: float, fmt: str) -> str:
        return "" if math.isnan(sd) else f" ± {sd:{fmt}}"

    for r in merge_same(table).itertuples(index=False):
        lines.append(
            f"| {r.model} | {r.scheme} "
            f"| {r.min_train_loss_mean:.4f}{spread(r.min_train_loss_std, '.4f')} "
            f"| {r.min_val_loss_mean:.4f}{spread(r.min_val_loss_std, '.4f')} "
            f"| {100 * r.max_val_accuracy_mean:.2f}%"
            f"{spread(100 * r.max_val_accuracy_std, '.2f')} "
            f"| {r.seeds} |"
        )
    return "\n".join(lines) + "\n"


def ordering(table: Any, baseline: str = "dp") -> list[str]:
    """Per model, each asynchronous scheme's maximum validation accuracy against
    ``baseline``'s (mean over seeds, in points, with the larger of the two spreads), and
    whether the paper's ordering holds there: SpecTrain above both PipeDream and vanilla
    pipelining, and both of them below ``baseline`` (with the margin, and whether it is
    within the spread over the seeds)."""
    out = []
    for model, g in table.groupby("model", sort=False):
        acc = dict(zip(g["scheme"], 100 * g["max_val_accuracy_mean"]))
        sd = dict(zip(g["scheme"], 100 * g["max_val_accuracy_std"]))
        if baseline not in acc:
            continue
        parts = []
        for s in ("spectrain", "pipedream", "vanilla", "gossip", *GOSSIP_VARIANTS):
            if s in acc:
                spread = max(sd[s], sd[baseline])
                parts.append(
                    f"{s} {acc[s] - acc[baseline]:+.2f}"
                    + ("" if math.isnan(spread) else f" (±{spread:.2f})")
                )
        order = ""
        if all(s in acc for s in ("spectrain", "pipedream", "vanilla")):
            stale = max(acc["pipedream"], acc["vanilla"])
            holds = acc["spectrain"] > stale and stale < acc[baseline]
            spread = max(sd[s] for s in ("spectrain", "pipedream", "vanilla", baseline))
            gap = min(acc["spectrain"] - stale, acc[baseline] - stale)
            order = "; the paper's ordering (spectrain above pipedream and vanilla, both " + (
                f"below {baseline}) {'holds' if holds else 'does not hold'}"
            )
            if holds:
                order += f", by {gap:.2f} points" + (
                    " (within the seeds' spread)" if gap <= spread else ""
                )
        out.append(
            f"{model}: max val accuracy against {baseline} ({acc[baseline]:.2f}%): "
            + ", ".join(parts)
            + " points"
            + order
        )
    return out


def plot_curves(curves: Any, model: str, path: str) -> None:
    """A seaborn figure of ``model``'s curves: training loss, validation loss and
    validation accuracy against the epoch, one line per scheme (the mean over seeds, the
    band their spread; one line for the schemes of :data:`SAME_NUMERICS`, whose curves
    are the same), written atomically to ``path`` (PNG)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from traces.atomic import atomic_path

    d = merge_same(curves[curves["model"] == model])
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, col, label in zip(
        axes,
        ("train_loss", "val_loss", "val_accuracy"),
        ("training loss", "validation loss", "validation accuracy"),
    ):
        sns.lineplot(
            data=d, x="epoch", y=col, hue="scheme", errorbar="sd", ax=ax, legend=ax is axes[-1]
        )
        ax.set_ylabel(label)
        if col != "val_accuracy":
            ax.set_yscale("log")
    axes[-1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{model}: convergence per scheme (mean and spread over seeds)")
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def disagreement_table(curves: Any) -> Any:
    """Per model and gossip scheme, the workers' disagreement at the first and the last
    epoch and its largest value (means over the seeds); empty without gossip curves."""
    d = curves.dropna(subset=["disagreement"])
    if not len(d):
        return d.iloc[0:0]
    g = d.sort_values("epoch").groupby(["model", "scheme", "seed"], sort=False)["disagreement"]
    per_seed = g.agg(first="first", last="last", max="max").reset_index()
    return per_seed.groupby(["model", "scheme"], sort=False)[["first", "last", "max"]].mean()


def plot_disagreement(curves: Any, path: str) -> None:
    """A seaborn figure of the gossip workers' disagreement (the mean distance of each
    worker's weights from their average) against the epoch, one panel per model, one line
    per gossip scheme (mean over seeds, band: their spread), log scale, written atomically
    to ``path`` (PNG). ``ValueError`` if ``curves`` has no disagreement."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from traces.atomic import atomic_path

    d = curves.dropna(subset=["disagreement"])
    if not len(d):
        raise ValueError("no gossip curves: nothing records a disagreement")
    models = list(dict.fromkeys(d["model"]))
    width = max(6.0, 4.2 * len(models))
    fig, axes = plt.subplots(1, len(models), figsize=(width, 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        sns.lineplot(
            data=d[d["model"] == model],
            x="epoch",
            y="disagreement",
            hue="scheme",
            errorbar="sd",
            ax=ax,
            legend=ax is axes[0][-1],
        )
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_ylabel("mean distance from the workers' average")
        ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle("gossip workers' disagreement per epoch (mean, spread over seeds)")
    fig.tight_layout()
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


# ---- time to accuracy -------------------------------------------------------------------


def seconds_per_update(
    model: str,
    scheme: str,
    gpus: int,
    batch: int,
    topology: str = "pcie",
    bandwidth: str | None = None,
) -> dict[str, Any]:
    """``sim run``'s steady-state time per weight update of convergence scheme ``scheme``
    for zoo model ``model`` (an analytic trace of it for a V100-class GPU, rescaled to the
    topology's GPU as ``sim run`` rescales any trace) on ``gpus`` GPUs of ``topology``:
    its iteration time over the updates per iteration (the micro-batches of
    ``pipedream``/``spectrain``, 1 otherwise). Returns ``{"seconds_per_update",
    "iteration_time_s", "updates_per_iteration", "device"}``."""
    import os
    import tempfile

    from analysis.resolve import build_config
    from realrun import data
    from realrun.profiler import ProfileConfig, profile_model
    from simcore.engine import simulate
    from simcore.schemes import get_scheme
    from simcore.spec import RunSpec
    from traces.jsonfmt import save

    job = training_job(model, scheme, gpus, 1, batch)
    trace = profile_model(
        model,
        ProfileConfig(
            batch_size=job.batch_size, analytic=True, device_flops=15.7e12, progress=False
        ),
    )
    settings: dict[str, Any] = {
        "scheme": job.scheme,
        "gpus": gpus,
        "topology": topology,
        "batch_size": job.batch_size,
        "iterations": 3,
        "warmup_iterations": 1,
    }
    if bandwidth:
        settings["bandwidth"] = bandwidth
    settings.update({f"scheme.{k}": v for k, v in job.options.items()})
    if get_scheme(job.scheme).pipeline:
        settings["scheme.partition"] = "antichain"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{model}.json")
        save(trace, path)
        settings["model"] = path
        result = simulate(build_config(RunSpec().replace(**settings), record_spans=False))
    k = data.updates_per_iteration(job)
    return {
        "seconds_per_update": result.iteration_time_s / k,
        "iteration_time_s": result.iteration_time_s,
        "updates_per_iteration": k,
        "device": result.gpu_model,
    }


def time_to_accuracy(
    curves: Any,
    target: float,
    gpus: int,
    batch: int,
    topology: str = "pcie",
    bandwidth: str | None = None,
) -> Any:
    """Per model and scheme: the updates to reach ``target`` validation accuracy (mean
    over the seeds that reach it, and how many do), ``sim run``'s seconds per update on
    ``gpus`` GPUs of ``topology`` (:func:`seconds_per_update`) and their product, the
    simulated time to accuracy."""
    import pandas as pd

    hits = to_target(curves, target)
    rows = []
    for (model, scheme), g in hits.groupby(["model", "scheme"], sort=False):
        reached = g["updates"].dropna()
        t = seconds_per_update(model, scheme, gpus, batch, topology, bandwidth)
        ups = float(reached.mean()) if len(reached) else math.nan
        rows.append(
            {
                "model": model,
                "scheme": scheme,
                "target": target,
                "seeds_reached": len(reached),
                "seeds": len(g),
                "epochs_to_target": float(g["epoch"].dropna().mean()) if len(reached) else math.nan,
                "updates_to_target": ups,
                "samples_to_target": float(g["samples"].dropna().mean())
                if len(reached)
                else math.nan,
                "seconds_per_update": t["seconds_per_update"],
                "time_to_target_s": ups * t["seconds_per_update"],
            }
        )
    return pd.DataFrame(rows)


def time_sentences(tta: Any, gpus: int, topology: str) -> list[str]:
    """One line per model: "on 4 GPUs of pcie, digits_cnn reaches 95% with spectrain in
    X s, ...", fastest first; schemes that never reach the target are named apart."""
    out = []
    for model, g in tta.groupby("model", sort=False):
        target = float(g["target"].iloc[0])
        ok = g.dropna(subset=["time_to_target_s"]).sort_values("time_to_target_s")
        parts = [
            f"{r.scheme} in {_seconds(r.time_to_target_s)} ({r.epochs_to_target:.1f} epochs"
            + (f", {r.seeds_reached} of {r.seeds} seeds" if r.seeds_reached < r.seeds else "")
            + ")"
            for r in ok.itertuples(index=False)
        ]
        never = [r.scheme for r in g.itertuples(index=False) if r.scheme not in set(ok["scheme"])]
        line = f"on {gpus} GPUs of {topology}, {model} reaches {100 * target:g}% with " + (
            ", ".join(parts) if parts else "no scheme"
        )
        if never:
            line += f"; never within the epochs run: {', '.join(never)}"
        out.append(line)
    return out


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def markdown_time_table(tta: Any) -> str:
    """:func:`time_to_accuracy`'s output as Markdown."""
    if not len(tta):
        return ""
    target = float(tta["target"].iloc[0])
    lines = [
        f"| model | scheme | epochs to {100 * target:g}% | samples | time per update "
        "| time to accuracy |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in tta.itertuples(index=False):
        reached = r.seeds_reached > 0
        note = (
            f" ({r.seeds_reached}/{r.seeds} seeds)" if reached and r.seeds_reached < r.seeds else ""
        )
        lines.append(
            f"| {r.model} | {r.scheme} "
            f"| {f'{r.epochs_to_target:.1f}' if reached else 'not reached'}{note} "
            f"| {f'{r.samples_to_target:,.0f}' if reached else '-'} "
            f"| {_seconds(r.seconds_per_update)} "
            f"| {_seconds(r.time_to_target_s) if reached else '-'} |"
        )
    return "\n".join(lines) + "\n"


# ---- the report's section ---------------------------------------------------------------

REPORT_SETTINGS = {
    "quick": {
        "models": ("digits_mlp",),
        "schemes": ("dp", "pipedream", "vanilla", "spectrain"),
        "epochs": 3,
    },
    "full": {"models": DIGITS_MODELS, "schemes": CONVERGENCE_SCHEMES, "epochs": 8},
}
"""What ``sim report`` (``--quick``) trains for its convergence section: one seed, the
default settings otherwise."""


def report_section(out_dir: str, quick: bool, target: float = 0.9) -> str:
    """``sim report``'s convergence and time-to-accuracy section (Markdown), with its
    curves in ``out_dir/data/convergence-curves.csv`` (reused when the settings match)
    and a figure per model in ``out_dir/figures/``."""
    import os

    import pandas as pd

    title = "## Convergence under staleness and time to accuracy\n\n"
    try:
        import sklearn  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        return title + f"*Not run:* needs torch and scikit-learn ({exc.name} is missing).\n"
    d = TrainSettings()
    conf = REPORT_SETTINGS["quick" if quick else "full"]
    models, schemes, epochs = conf["models"], conf["schemes"], int(conf["epochs"])
    lrs = {m: dict(d.model_lr).get(m, d.lr) for m in models}
    path = os.path.join(out_dir, "data", "convergence-curves.csv")
    curves = pd.read_csv(path) if os.path.exists(path) else None
    want = {(m, s, 0, e) for m in models for s in schemes for e in range(1, epochs + 1)}
    if curves is None or not want <= set(
        zip(curves["model"], curves["scheme"], curves["seed"], curves["epoch"], strict=True)
    ):
        curves = train(models, schemes, (0,), d.gpus, epochs, d.batch, lrs, d.momentum)
        from traces.atomic import atomic_path

        with atomic_path(path, ".csv") as tmp:
            curves.to_csv(tmp, index=False)
    for m in models:
        plot_curves(curves, m, os.path.join(out_dir, "figures", f"convergence-{m}.png"))
    tta = time_to_accuracy(curves, target, d.gpus, d.batch, d.topology)
    command = (
        f"sim train --model {','.join(models)} --scheme {','.join(schemes)} "
        f"--epochs {epochs} --seed 0 --target-accuracy {target:g}"
    )
    return (
        title + "*Paper (SpecTrain):* vanilla pipelining and PipeDream lose accuracy on some "
        "models, weight prediction stays close to data parallelism (e.g. ResNet-152: "
        "DP 71.2%, vanilla 70.3%, PipeDream 67.9%, SpecTrain 71.0%).\n\n"
        f"*Here:* `{command}`: the staleness emulator (each pipeline stage on the weight "
        f"version its schedule prescribes) trains {', '.join(models)} "
        f"on {d.gpus} GPUs, {d.batch} samples per update; time to accuracy multiplies the "
        f"updates to {100 * target:g}% by `sim run`'s time per update on {d.gpus} GPUs of "
        f"`{d.topology}`.\n\n"
        + "".join(f"![{m}](figures/convergence-{m}.png)\n\n" for m in models)
        + markdown_table(paper_table(curves))
        + "\n"
        + markdown_time_table(tta)
        + "\n"
        + "".join(f"- {line}\n" for line in time_sentences(tta, d.gpus, d.topology))
        + "\n"
        + "".join(f"- {line}\n" for line in ordering(paper_table(curves)))
    )
