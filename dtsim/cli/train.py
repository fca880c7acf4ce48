"""``sim train``: convergence under staleness, and time to accuracy."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

from analysis.convergence import CONVERGENCE_SCHEMES, DIGITS_MODELS, TrainSettings
from dtsim.cli.errors import BadInput
from dtsim.cli.options import out_option

_D = TrainSettings()


def _split(values: Sequence[str], what: str, allowed: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for v in values:
        for item in v.split(","):
            item = item.strip()
            if not item:
                continue
            if allowed is not None and item not in allowed:
                raise BadInput(
                    f"{what}: {item!r} is not allowed; choose from: {', '.join(allowed)}"
                )
            if item not in out:
                out.append(item)
    return out


def _rates(values: Sequence[str], models: Sequence[str]) -> dict[str, float]:
    """Learning rate per model: the defaults, then a bare value for all, then MODEL=LR."""
    base = _D.lr
    per = dict(_D.model_lr)
    own: dict[str, float] = {}
    for item in _split(values, "--lr", None):
        name, _, value = item.rpartition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not rate > 0 or (name and name not in models):
            allowed = ", ".join(models)
            raise BadInput(
                f"--lr: {item!r} is not allowed; give a positive rate (0.02) or "
                f"MODEL=RATE for one of: {allowed}"
            )
        if name:
            own[name] = rate
        else:
            base, per = rate, {}
    return {m: own.get(m, per.get(m, base)) for m in models}


def _seeds(values: Sequence[str]) -> list[int]:
    out = []
    for item in _split(values, "--seed", None):
        try:
            out.append(int(item))
        except ValueError:
            raise BadInput(
                f"--seed: {item!r} is not allowed; give whole numbers, e.g. 0,1,2"
            ) from None
    return out


@click.command("train")
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME[,NAME]",
    help=f"Zoo models, repeatable or comma-separated. [default: {','.join(DIGITS_MODELS)}]",
)
@click.option(
    "--scheme",
    "schemes",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Schemes, repeatable or comma-separated: "
    f"{', '.join(CONVERGENCE_SCHEMES)} (vanilla: pipedream without weight stashing; "
    "gossip averages weights and momentum, gossip-X exchanges X instead). [default: all]",
)
@click.option(
    "--gpus",
    type=int,
    default=_D.gpus,
    show_default=True,
    help="Data-parallel workers, or pipeline stages.",
)
@click.option(
    "--epochs",
    type=int,
    default=_D.epochs,
    show_default=True,
    help="Passes over the training split.",
)
@click.option(
    "--lr",
    "lrs",
    multiple=True,
    metavar="LR|MODEL=LR",
    help="Learning rate of SGD with momentum, for every model or one (repeatable). "
    f"[default: {_D.lr:g}, {', '.join(f'{m}={v:g}' for m, v in _D.model_lr)}]",
)
@click.option("--momentum", type=float, default=_D.momentum, show_default=True, help="Momentum.")
@click.option(
    "--batch",
    type=int,
    default=_D.batch,
    show_default=True,
    help="Samples per weight update, over all workers (the same for every scheme).",
)
@click.option(
    "--seed",
    "seeds",
    multiple=True,
    metavar="N[,N]",
    help="Seeds (split, initial weights, data order), repeatable or comma-separated. [default: 0]",
)
@click.option(
    "--target-accuracy",
    type=float,
    default=_D.target_accuracy,
    show_default=True,
    help="Validation accuracy (0-1, or a percentage) for epochs and time to target.",
)
@click.option(
    "--topology",
    metavar="NAME|FILE",
    default=_D.topology,
    show_default=True,
    help="Cluster of sim run for time to accuracy (sim topologies).",
)
@click.option(
    "--real",
    is_flag=True,
    help="Multi-process runs (torch.distributed, gloo) instead of the staleness emulator.",
)
@out_option(
    "Write curves.csv/.parquet, table.csv/.md, to_target.csv, "
    "time_to_accuracy.csv, a PNG per model and, with gossip, disagreement.png here.",
    folder=True,
    dest="out_dir",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar. [default: when stderr is a terminal]",
)
def train(
    models: tuple[str, ...],
    schemes: tuple[str, ...],
    gpus: int,
    epochs: int,
    lrs: tuple[str, ...],
    momentum: float,
    batch: int,
    seeds: tuple[str, ...],
    target_accuracy: float,
    topology: str,
    real: bool,
    out_dir: str | None,
    progress: bool | None,
) -> None:
    """Train models to completion on real data under each scheme and compare accuracy.

    The digits data (scikit-learn, 8x8 images, 80/20 split by seed), the same update
    batches in the same order for every scheme. By default the staleness emulator
    trains in this process, each pipeline stage on the weight version its schedule
    prescribes (equal to the multi-process run); --real runs the ranks for real. Prints
    the paper-style table (min train loss, min val loss, max val accuracy, mean ± sample
    standard deviation over seeds), the epochs to the target accuracy and the time to it
    on --gpus GPUs of --topology (sim run's time per update times the updates needed),
    and for gossip the workers' disagreement (mean distance of each worker's weights from
    their average) per epoch.

    \b
    Examples:
      sim train --model digits_cnn --scheme dp,pipedream,vanilla,spectrain --epochs 5
      sim train --seed 0,1,2 --epochs 10 --out conv/
    """
    from dtsim.resolve import topology_presets
    from realrun import zoo

    presets = list(topology_presets())

    model_list = _split(models, "--model", zoo.names()) or list(DIGITS_MODELS)
    scheme_list = _split(schemes, "--scheme", CONVERGENCE_SCHEMES) or list(CONVERGENCE_SCHEMES)
    seed_list = _seeds(seeds) or list(_D.seeds)
    for name, value, low in (("--gpus", gpus, 1), ("--epochs", epochs, 1), ("--batch", batch, 1)):
        if value < low:
            raise BadInput(f"{name}: {value} is not allowed; give {low} or more")
    if out_dir is not None:
        from dtsim.cli.output import check_output_dir

        check_output_dir("--out", out_dir)
    if real:
        from realrun.guard import ModelFootprint, available_memory, machine_cores, rank_refusal

        why = rank_refusal(gpus, ModelFootprint(0, 0), available_memory(), machine_cores())
        if why is not None:
            raise BadInput(f"--gpus: {gpus:,} workers for --real: {why}; use fewer --gpus")
    lr = _rates(lrs, model_list)
    if not 0 <= momentum < 1:
        raise BadInput(f"--momentum: {momentum} is not allowed; give a value in [0, 1)")
    if 1 < target_accuracy <= 100:
        target_accuracy /= 100
    if not 0 < target_accuracy <= 1:
        raise BadInput(
            f"--target-accuracy: {target_accuracy} is not allowed; give a fraction in (0, 1] "
            "or a percentage, e.g. 0.95 or 95"
        )
    if topology not in presets and not os.path.isfile(topology):
        raise BadInput(
            f"--topology: {topology!r} is not allowed; choose one of: "
            f"{', '.join(presets)}, or a preset YAML file"
        )
    bad = [m for m in model_list if zoo.get(m).inputs[0].shape not in ((64,), (1, 8, 8), (8, 8))]
    if bad:
        raise BadInput(
            f"--model: {bad[0]!r} is not allowed; it cannot read 8x8 digits; choose from: "
            f"{', '.join(DIGITS_MODELS)}"
        )
    try:
        import sklearn  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise BadInput(
            f"sim train needs torch and scikit-learn ({exc.name} is missing); "
            "install them with: pip install -e '.[real]'"
        ) from None
    from analysis import convergence as cv

    try:  # every job first, so a bad combination fails before any training
        for m in model_list:
            for s in scheme_list:
                cv.training_job(m, s, gpus, 1, batch, lr[m], momentum, seed_list[0])
    except ValueError as exc:
        raise BadInput(" ".join(str(exc).split())) from None

    from dtsim.cli.output import output_folder

    with output_folder("--out", out_dir):
        _train_and_report(
            model_list,
            scheme_list,
            seed_list,
            gpus,
            epochs,
            lr,
            momentum,
            batch,
            target_accuracy,
            topology,
            real,
            out_dir,
            progress,
        )


def _train_and_report(
    model_list: list[str],
    scheme_list: list[str],
    seed_list: list[int],
    gpus: int,
    epochs: int,
    lr: dict[str, float],
    momentum: float,
    batch: int,
    target_accuracy: float,
    topology: str,
    real: bool,
    out_dir: str | None,
    progress: bool | None,
) -> None:
    """Train every run, print the tables, write the outputs (see :func:`train`)."""
    from tqdm import tqdm

    from analysis import convergence as cv

    show = sys.stderr.isatty() if progress is None else progress
    runs = len(model_list) * len(scheme_list) * len(seed_list)
    t0 = time.perf_counter()
    with tqdm(
        total=runs * epochs,
        desc=f"{'real runs' if real else 'emulator'}: {runs} runs",
        unit="epoch",
        disable=not show,
        leave=False,
    ) as bar:
        curves = cv.train(
            model_list,
            scheme_list,
            seed_list,
            gpus,
            epochs,
            batch,
            lr,
            momentum,
            real=real,
            progress=bar.update,
        )
    table = cv.paper_table(curves)
    hits = cv.to_target(curves, target_accuracy)
    tta = cv.time_to_accuracy(curves, target_accuracy, gpus, batch, topology)
    click.echo(
        f"{'real runs' if real else 'staleness emulator'}: digits, {gpus} GPUs, {epochs} "
        f"epochs, {batch} samples per update, lr "
        f"{', '.join(f'{m} {v:g}' for m, v in lr.items())}, momentum {momentum:g}, "
        f"seeds {','.join(map(str, seed_list))} ({runs} runs in "
        f"{time.perf_counter() - t0:.0f} s)"
    )
    click.echo(cv.markdown_table(table))
    click.echo(cv.markdown_time_table(tta))
    for line in cv.time_sentences(tta, gpus, topology):
        click.echo(line)
    for line in cv.ordering(table):
        click.echo(line)
    spread = cv.disagreement_table(curves)
    if len(spread):
        click.echo("gossip workers' disagreement (mean distance from their average):")
        for (m, s), r in spread.iterrows():
            click.echo(
                f"  {m} {s}: epoch 1 {r['first']:.4g}, last {r['last']:.4g}, max {r['max']:.4g}"
            )
    if out_dir is not None:
        _write(out_dir, curves, table, hits, tta, model_list)
        click.echo(f"wrote {out_dir}/ (curves, table, to_target, time_to_accuracy, figures)")


def _write(out: str, curves: Any, table: Any, hits: Any, tta: Any, models: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from analysis import convergence as cv
    from traces.atomic import atomic_path, write_text

    os.makedirs(out, exist_ok=True)
    for name, df in (
        ("curves", curves),
        ("table", table),
        ("to_target", hits),
        ("time_to_accuracy", tta),
    ):
        with atomic_path(os.path.join(out, f"{name}.csv"), ".csv") as tmp:
            df.to_csv(tmp, index=False)
    with atomic_path(os.path.join(out, "curves.parquet"), ".parquet") as tmp:
        curves.to_parquet(tmp, index=False)
    write_text(os.path.join(out, "table.md"), cv.markdown_table(table))
    for m in models:
        cv.plot_curves(curves, m, os.path.join(out, f"convergence-{m}.png"))
    if curves["disagreement"].notna().any():
        cv.plot_disagreement(curves, os.path.join(out, "disagreement.png"))
