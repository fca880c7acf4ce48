"""``sim validate``: simulated against measured, over a matrix of real runs."""

from __future__ import annotations

import math
import os
import shlex
import sys
from typing import Any

import click

from analysis.matrix_defaults import (
    BATCH,
    FAIL_ABOVE,
    FAIL_ABOVE_MAX,
    ITERATIONS,
    MAX_ITERATIONS,
    MIN_MEASURED_S,
    RANKS,
    REPEATS,
    SIM_JITTER,
    SIM_SEEDS,
)
from dtsim.cli.errors import BadInput
from dtsim.cli.options import out_option
from dtsim.cli.output import check_output_dir, output_folder, table

EMULATED_MATRICES = ("seed", "unseen", "unseen2", "schedules", "scaling", "bandwidth")
"""``--matrix`` names of ``--device emulated`` (and ``--quick``'s)."""


@click.command("validate")
@click.option(
    "--quick",
    is_flag=True,
    help="The small matrix, for CI: cpu: dp, ps, gpipe, pipedream at 1 Gbit/s (a few "
    "minutes); emulated: dp, p3, gossip, gpipe on four emulated ResNet-18 hosts.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "emulated"]),
    default="cpu",
    show_default=True,
    help="cpu: zoo models computing on this machine's cores; emulated: the seed papers' "
    "layer traces on emulated devices (sim real --device emulated; "
    "docs/emulated_devices.md), scored against predictions registered first.",
)
@click.option(
    "--matrix",
    "matrix_name",
    type=click.Choice(["development", "heldout", *EMULATED_MATRICES]),
    default=None,
    help="cpu: development (the default; the matrix the model is tuned on, --schemes, "
    "--models, ... choose within it) or heldout (24 cases it never was: a ResNet, a "
    "Transformer and a user model by file, batch 36, 500 Mbit/s, all eight schemes, to run "
    "only with the model frozen and its predictions registered first, --predict-only). "
    "emulated: seed (the default; 25 cases, all eight schemes, 4 to 16 ranks), unseen (10 "
    "other cases of the same workloads, never tuned on), unseen2 (24 more), schedules (21: "
    "1f1b, zb-h1 and torch's five newer schedules on 4 ranks), scaling (2 to 16 ranks), "
    "bandwidth (1 to 25 Gbit/s) or quick.",
)
@click.option(
    "--schemes",
    default=None,
    metavar="LIST",
    help="Schemes to validate, comma-separated (--device emulated: the matrix's cases of "
    "these schemes). [default: all eight]",
)
@click.option(
    "--models",
    default=None,
    metavar="LIST",
    help="Zoo models (or FILE.py:NAME) to run. [default: mlp_medium,cnn_medium]",
)
@click.option(
    "--input-shape",
    default=None,
    metavar="SHAPE",
    help="Per-sample input shape (e.g. 3,32,32) of a FILE.py:NAME model whose NAME returns "
    "only a module.",
)
@click.option(
    "--bandwidths",
    default=None,
    metavar="LIST",
    help="Link rates of the emulated cluster. [default: 200Mbps,1Gbps]",
)
@click.option(
    "--ranks",
    default=None,
    metavar="LIST",
    help="Rank counts (2-4); each scheme x model x bandwidth takes the next one in turn "
    "(see --every-rank). [default: 2,3,4]",
)
@click.option(
    "--every-rank",
    is_flag=True,
    help="Run every rank count for every scheme x model x bandwidth (the whole cross product).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=REPEATS,
    show_default=True,
    help="Real runs per case (median, min, max and spread are reported).",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=ITERATIONS,
    show_default=True,
    help="Measured iterations per run (after the warm-up iterations), at least; see "
    "--min-measured-s.",
)
@click.option(
    "--min-measured-s",
    type=float,
    default=MIN_MEASURED_S,
    show_default=True,
    help="Seconds each run measures at least: a case predicted to iterate faster makes "
    f"more measured iterations (up to {MAX_ITERATIONS}); 0: exactly --iterations.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=BATCH,
    show_default=True,
    help="Samples per worker per iteration (a pipeline: its mini-batch); a multiple of 12.",
)
@out_option(
    "Output folder; cases already in it are skipped (an interrupted run resumes).",
    folder=True,
    default="validation",
)
@click.option(
    "--calibration",
    default=None,
    metavar="PRESET",
    help="Simulate on this topology preset (name or YAML file) instead of calibrating the "
    "emulated cluster once per bandwidth.",
)
@click.option(
    "--calibrate-at",
    default=None,
    metavar="RATE",
    help="Calibrate the emulated cluster once, at this link rate, and predict every "
    "bandwidth from it (the goodput share and host costs carry; the what-if across link "
    "rates). [default: calibrate at each bandwidth]",
)
@click.option(
    "--predict-only",
    is_flag=True,
    help="Calibrate, profile and predict every case, write the predictions with the commit, "
    "the time and the inputs' hashes to DIR/predictions.json, and stop before any real run "
    "of a case; a later 'sim validate' with the same --out scores them as written.",
)
@click.option(
    "--fail-above",
    type=click.FloatRange(min=0, min_open=True),
    default=FAIL_ABOVE,
    show_default=True,
    help="Exit with status 1 when the median |predicted - measured| / measured iteration "
    "time exceeds this.",
)
@click.option(
    "--fail-above-max",
    type=click.FloatRange(min=0, min_open=True),
    default=FAIL_ABOVE_MAX,
    show_default=True,
    help="Exit with status 1 when the largest |predicted - measured| / measured exceeds this.",
)
@click.option(
    "--sim-seeds",
    type=int,
    default=SIM_SEEDS,
    show_default=True,
    help="Simulations of each real run, one seed of compute jitter each; their mean is the "
    "run's prediction.",
)
@click.option(
    "--sim-jitter",
    type=float,
    default=SIM_JITTER,
    show_default=True,
    help="Coefficient of variation of each simulated op's CPU work in those simulations "
    "(0: one deterministic simulation per run).",
)
@click.option("--dry-run", is_flag=True, help="List the cases and exit.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar. [default: when stderr is a terminal]",
)
@click.pass_context
def validate(
    ctx: click.Context,
    device: str,
    quick: bool,
    matrix_name: str | None,
    schemes: str | None,
    models: str | None,
    input_shape: str | None,
    bandwidths: str | None,
    ranks: str | None,
    every_rank: bool,
    repeats: int,
    iterations: int,
    min_measured_s: float,
    batch_size: int,
    out: str,
    calibration: str | None,
    calibrate_at: str | None,
    predict_only: bool,
    fail_above: float,
    fail_above_max: float,
    sim_seeds: int,
    sim_jitter: float,
    dry_run: bool,
    progress: bool | None,
) -> None:
    """Check the simulator's predictions against real runs: for each case of a matrix
    (schemes x models x bandwidths x ranks), calibrate the emulated cluster (once per
    bandwidth, or once with --calibrate-at or --calibration), profile each model once
    (the data-parallel runtime on two ranks at two batch sizes; every case of the model,
    its micro-batches included, is predicted from that one profile), predict the case
    from the profile and the calibration alone, run it for real --repeats times
    (network namespaces, needs root) and compare iteration time, throughput, bytes per
    link (exactly), utilisation and bubble per rank.

    The prediction is what is scored. Each run is also replayed (simulated again on its
    own measured layer times and overheads, --sim-seeds times with a little compute
    jitter): a labelled second column that tells a wrong input from a wrong model, never
    the headline. With --predict-only the predictions are registered first (commit,
    time, input hashes); a later run of the same --out scores them as written.

    Writes DIR/validation.parquet and .csv (one row per case), DIR/report.md with a
    scatter of predicted (and replayed) against measured time and per-case timelines,
    the Chrome traces of both sides in DIR/timelines/, and each real run's records in
    DIR/real/ (bench/resimulate.py simulates them again). Rerunning the same command
    skips finished cases. Exits 1 when the prediction's median error exceeds
    --fail-above or its largest --fail-above-max.

    \b
    Examples:
      sim validate --quick
      sim validate --out validation/
      sim validate --schemes dp,pipedream --models mlp_medium --bandwidths 1Gbps --ranks 2
    """
    from analysis.validate import format_summary, run_validation
    from analysis.validation.harness import table_path
    from analysis.validation.matrix import (
        BANDWIDTHS,
        HELDOUT_BATCH,
        MODELS,
        SCHEMES,
        build_matrix,
        heldout_matrix,
        parse_list,
        quick_matrix,
    )
    from analysis.validation.replay import Ensemble
    from simcore.config import ConfigError

    if device == "emulated":
        _validate_emulated(
            ctx, "quick" if quick else matrix_name or "seed", out, calibration, calibrate_at,
            predict_only, repeats, iterations, fail_above, fail_above_max, dry_run, progress,
            schemes,
        )  # fmt: skip
        return
    if matrix_name in EMULATED_MATRICES:
        raise BadInput(f"--matrix: {matrix_name} is a matrix of --device emulated")
    matrix_name = matrix_name or "development"
    if calibration is not None:
        from analysis.resolve import load_preset

        try:
            load_preset(calibration)
        except ConfigError as exc:
            if exc.field != "topology":  # a bad key in the file: named with the file
                raise
            raise ConfigError("calibration", exc.value, exc.allowed) from None
    check_output_dir("--out", out)
    rate_at = None
    if calibrate_at is not None:
        if calibration is not None:
            raise BadInput("--calibrate-at: give it or --calibration, not both")
        from simcore.units import UnitError, parse_rate

        try:
            rate_at = parse_rate(calibrate_at)
        except (UnitError, ValueError) as exc:
            raise ConfigError("calibrate_at", calibrate_at, str(exc)) from None
        if not rate_at > 0:
            raise ConfigError("calibrate_at", calibrate_at, "expected a positive rate, e.g. 1Gbps")
    ensemble = Ensemble(sim_seeds, sim_jitter)
    matrix: tuple[tuple[Any, ...], ...] = ()
    if quick or matrix_name == "heldout":
        given = [
            f
            for f, v in (
                ("--schemes", schemes),
                ("--models", models),
                ("--bandwidths", bandwidths),
                ("--ranks", ranks),
                ("--input-shape", input_shape),
            )
            if v is not None
        ] + (["--every-rank"] if every_rank else [])
        named = "--quick" if quick else "--matrix heldout"
        if quick and matrix_name == "heldout":
            raise BadInput("--quick: give it or --matrix heldout, not both")
        if given:
            raise BadInput(
                f"{named}: it has its own matrix and takes no {given[0]}; "
                f"drop {named} to choose the matrix"
            )
        if quick:
            cases = quick_matrix(
                iterations=iterations, batch_size=batch_size, min_measured_s=min_measured_s
            )
        else:
            if batch_size != BATCH:
                raise BadInput(f"--matrix heldout: its batch is {HELDOUT_BATCH}; drop --batch-size")
            cases = heldout_matrix(iterations=iterations, min_measured_s=min_measured_s)
    else:
        rank_list = []
        for text in parse_list("ranks", ranks if ranks is not None else ",".join(map(str, RANKS))):
            try:
                rank_list.append(int(text))
            except ValueError:
                raise ConfigError("ranks", text, "expected whole numbers from 2 to 4") from None
        matrix = (
            parse_list("schemes", schemes) if schemes is not None else SCHEMES,
            parse_list("models", models) if models is not None else MODELS,
            parse_list("bandwidths", bandwidths) if bandwidths is not None else BANDWIDTHS,
            tuple(rank_list),
        )
        from realrun.usermodel import parse_input_shape

        shape = parse_input_shape(input_shape)
        cases = build_matrix(
            *matrix,
            every_rank=every_rank,
            input_shape=shape,
            batch_size=batch_size,
            iterations=iterations,
            min_measured_s=min_measured_s,
        )
    if dry_run:
        click.echo(f"{len(cases)} case{'s' if len(cases) != 1 else ''}:")
        click.echo(table([(c.case_id, c.describe()) for c in cases]))
        return
    if not (predict_only and calibration is not None):  # calibrations and real runs
        from dtsim.cli.clean import clean_stale
        from realrun.netns import check_available

        clean_stale()
        check_available()
    command = _command_line(
        matrix_name if not quick else "quick",
        matrix,
        every_rank,
        input_shape,
        repeats,
        iterations,
        min_measured_s,
        batch_size,
        out,
        calibration,
        calibrate_at,
        fail_above,
        fail_above_max,
        ensemble,
    )
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Bar(len(cases), show)
    if predict_only:
        _predict_only(cases, out, calibration, rate_at, bar, command)
        return
    try:
        with output_folder("--out", out, keep_partial=True):
            summary = run_validation(
                cases,
                out,
                repeats=repeats,
                topology_file=calibration,
                calibrate_at=rate_at,
                progress=bar,
                command=command,
                ensemble=ensemble,
            )
    except KeyboardInterrupt:
        bar.close()
        click.echo(
            f"Interrupted: the finished cases are in {out}; run the same command again to go on.",
            err=True,
        )
        raise
    bar.close()
    click.echo(summary_table(summary.rows))
    click.echo(format_summary(summary))
    for line in summary.errors[:10]:
        click.echo(f"  failed: {line}")
    med = summary.prediction_median_abs_rel_err
    worst = summary.prediction_max_abs_rel_err
    if math.isnan(med):
        _fail("no case finished, so there is no error to judge; see the failures above")
    if med > fail_above:
        _fail(
            f"median |prediction error| of iteration time is {100 * med:.1f}%, above "
            f"--fail-above {100 * fail_above:g}%; see {os.path.join(out, 'report.md')}"
        )
    if worst > fail_above_max:
        _fail(
            f"largest |prediction error| of iteration time is {100 * worst:.1f}%, above "
            f"--fail-above-max {100 * fail_above_max:g}%; see {os.path.join(out, 'report.md')}"
        )
    if summary.failed:
        _fail(
            f"{summary.failed} of {summary.cases} cases failed; their errors are in the "
            f"'error' column of {table_path(out)}"
        )


def _predict_only(
    cases: Any,
    out: str,
    calibration: str | None,
    rate_at: float | None,
    bar: Any,
    command: str,
) -> None:
    """``--predict-only``: calibrate, profile and register every case's prediction."""
    from analysis.validation.inputs import prepare_calibrations
    from analysis.validation.prediction import predictions_path, register_predictions

    path = predictions_path(out)
    if os.path.exists(path):
        raise BadInput(
            f"--out: {out} already holds registered predictions ({path}); they are never "
            "rewritten: give another --out"
        )
    try:
        with output_folder("--out", out, keep_partial=True):
            calibrations = prepare_calibrations(
                cases, out, topology_file=calibration, calibrate_at=rate_at, progress=bar
            )
            data = register_predictions(
                cases, out, calibrations, command=command, progress=bar,
            )  # fmt: skip
    finally:
        bar.close()
    lines = [f"{'case':<34} {'predicted':>10} {'iterations':>10}  calibration"]
    for case in cases:
        e = data["cases"][case.case_id]
        moved = f" (moved from {e['calibration_rate']})" if e.get("calibration_moved") else ""
        lines.append(
            f"{e['case']:<34} {1e3 * e['iteration_time_s']:>8.1f}ms {e['run_iterations']:>10}  "
            f"{os.path.relpath(e['calibration'])}{moved}"
        )
    click.echo("\n".join(lines))
    commit = data["commit"] or "not a git checkout"
    dirty = " (with uncommitted changes)" if data["dirty"] else ""
    click.echo(
        f"{len(cases)} predictions registered at {data['registered_at']}, commit {commit}{dirty}: "
        f"{path}\nrun the real side and score them: {data['command']}"
    )


def _fail(message: str) -> None:
    err = click.ClickException(message)
    err.exit_code = 1
    raise err


def summary_table(rows: Any) -> str:
    """One line per case: measured and predicted iteration time, the prediction's and the
    replay's error, the real runs' spread, bytes."""
    from analysis.validation.rows import predicted_s, prediction_err

    lines = [
        f"{'case':<34} {'measured':>9} {'predicted':>9} {'error':>7} {'replay':>7} "
        f"{'spread':>7}  bytes  why (replay)"
    ]
    for r in rows:
        name = f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}"
        if r.get("status") != "ok":
            lines.append(f"{name:<34} failed: {r.get('error', '')}")
            continue
        lines.append(
            f"{name:<34} {1e3 * float(r['real_iteration_time_s']):>7.1f}ms "
            f"{1e3 * predicted_s(r):>7.1f}ms "
            f"{100 * prediction_err(r):>+6.1f}% "
            f"{100 * float(r['rel_err']):>+6.1f}% {100 * float(r['real_spread']):>6.1f}%  "
            f"{'exact' if str(r['bytes_exact']).lower() in ('true', '1') else 'DIFF '}  "
            f"{r.get('why') or ''}"
        )
    return "\n".join(lines)


def _command_line(
    named: str,
    matrix: tuple[tuple[Any, ...], ...],
    every_rank: bool,
    input_shape: str | None,
    repeats: int,
    iterations: int,
    min_measured_s: float,
    batch_size: int,
    out: str,
    calibration: str | None,
    calibrate_at: str | None,
    fail_above: float,
    fail_above_max: float,
    ensemble: Any,
) -> str:
    """The command that reproduces this validation, every choice spelled out (``named``:
    ``quick``, ``heldout`` or ``development``; ``matrix``: the development matrix's
    schemes, models, bandwidths and ranks)."""
    args = ["sim", "validate"]
    if named == "quick":
        args.append("--quick")
    elif named == "heldout":
        args += ["--matrix", "heldout"]
    else:
        for flag, values in zip(("--schemes", "--models", "--bandwidths", "--ranks"), matrix):
            args += [flag, ",".join(map(str, values))]
        if every_rank:
            args.append("--every-rank")
        if input_shape:
            args += ["--input-shape", input_shape]
    args += [
        "--repeats",
        str(repeats),
        "--iterations",
        str(iterations),
        "--min-measured-s",
        f"{min_measured_s:g}",
        *(["--batch-size", str(batch_size)] if named != "heldout" else []),
        "--out",
        out,
    ]
    if calibration:
        args += ["--calibration", calibration]
    if calibrate_at:
        args += ["--calibrate-at", calibrate_at]
    args += ["--fail-above", f"{fail_above:g}", "--fail-above-max", f"{fail_above_max:g}"]
    args += ["--sim-seeds", str(ensemble.seeds), "--sim-jitter", f"{ensemble.jitter:g}"]
    return shlex.join(args)


class _Bar:
    """A tqdm bar over the cases; the current case in its description."""

    def __init__(self, total: int, show: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="validate", unit="case", disable=not show)

    def __call__(self, case: Any, state: str) -> None:
        if state == "start":
            self.bar.set_description(case.describe())
        elif state == "calibrate":
            self.bar.set_description(f"calibrating {case.bandwidth}")
        else:
            self.bar.update(1)

    def describe(self, text: str) -> None:
        self.bar.set_description(text)

    def close(self) -> None:
        self.bar.close()


def _validate_emulated(
    ctx: click.Context,
    matrix_name: str,
    out: str,
    calibration: str | None,
    calibrate_at: str | None,
    predict_only: bool,
    repeats: int,
    iterations: int,
    fail_above: float,
    fail_above_max: float,
    dry_run: bool,
    progress: bool | None,
    schemes: str | None = None,
) -> None:
    """``sim validate --device emulated`` (:mod:`analysis.emulated_validation`);
    ``schemes`` picks the matrix's cases of those schemes."""
    from dataclasses import replace

    from analysis import emulated_validation as ev
    from analysis.resolve import load_preset
    from simcore.config import ConfigError
    from simcore.units import parse_rate

    if matrix_name not in ev.MATRICES:
        raise BadInput(
            f"--matrix: {matrix_name} is not a matrix of --device emulated; choose one of: "
            f"{', '.join(ev.MATRICES)}"
        )
    for name in ("models", "bandwidths", "ranks", "input_shape", "every_rank"):
        if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            flag = "--" + name.replace("_", "-")
            raise BadInput(f"{flag}: --device emulated runs its own matrices; drop {flag}")
    default = click.core.ParameterSource.DEFAULT
    if ctx.get_parameter_source("fail_above") == default:
        fail_above = ev.FAIL_ABOVE
    if ctx.get_parameter_source("fail_above_max") == default:
        fail_above_max = ev.FAIL_ABOVE_MAX
    cases = ev.MATRICES[matrix_name]
    if schemes:
        have = list(dict.fromkeys(c.scheme for c in cases))
        wanted = [x.strip() for x in schemes.split(",") if x.strip()]
        bad = [x for x in wanted if x not in have]
        if bad or not wanted:
            raise BadInput(
                f"--schemes: {', '.join(bad) or repr(schemes)} not in the {matrix_name} "
                f"matrix; choose from: {', '.join(have)}"
            )
        cases = tuple(c for c in cases if c.scheme in wanted)
    if ctx.get_parameter_source("iterations") != default:
        cases = tuple(replace(c, iterations=iterations) for c in cases)
    if dry_run:
        click.echo(f"{len(cases)} case{'s' if len(cases) != 1 else ''}:")
        click.echo(table([(c.case_id, f"{c.trace} x{c.gpus} {c.scheme}") for c in cases]))
        return
    if calibration is not None and calibrate_at is not None:
        raise BadInput("--calibrate-at: give it or --calibration, not both")
    if calibration is not None:
        try:
            load_preset(calibration)
        except ConfigError as exc:
            shown = "--calibration" if exc.field == "topology" else exc.field
            raise BadInput(exc.describe(shown)) from None
    check_output_dir("--out", out)
    from dtsim.cli.clean import clean_stale
    from realrun.netns import check_available

    clean_stale()
    check_available()
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Bar(len(cases) * (1 if predict_only else 2), show)
    command = " ".join(["sim", *sys.argv[1:]]) if sys.argv else "sim validate --device emulated"
    try:
        with output_folder("--out", out, keep_partial=True):
            if calibration is None:
                from analysis.validation.inputs import default_calibrator, ensure_calibration

                rate = parse_rate(calibrate_at or ev.CALIBRATION_RATE)
                bar.describe(f"calibrating at {calibrate_at or ev.CALIBRATION_RATE}")
                calibration = ensure_calibration(out, rate, default_calibrator)
            data = ev.register(cases, out, calibration, command=command, progress=bar)
            if predict_only:
                bar.close()
                click.echo(
                    f"{len(cases)} predictions registered at {data['registered_at']} "
                    f"(commit {data['commit'] or 'none'}): {ev.predictions_path(out)}"
                )
                return
            rows = ev.run_cases(cases, out, data, calibration, repeats=repeats, progress=bar)
            s = ev.score(rows)
            ev.write_results(rows, out, s)
    finally:
        bar.close()
    click.echo(
        table(
            [
                (
                    r["case_id"],
                    f"{r.get('status')}"
                    + (
                        f"  real {1e3 * r['real_iteration_time_s']:.1f} ms, predicted "
                        f"{1e3 * r['predicted_iteration_time_s']:.1f} ms "
                        f"({100 * r['prediction_rel_err']:+.1f}%), CPU "
                        f"{100 * r['machine_cpu_busy_share']:.0f}%, bytes "
                        f"{'exact' if r['bytes_exact'] else 'DIFFER'}"
                        if r.get("status") in ("ok", "flagged")
                        else f"  {r.get('error', '')}"
                    ),
                )
                for r in rows
            ]
        )
    )
    click.echo(s.line())
    if not s.counted:
        _fail("no case was counted (all failed or were flagged); see results.csv")
    if s.median_abs_err > fail_above:
        _fail(
            f"median |prediction error| {100 * s.median_abs_err:.1f}% "
            f"is above --fail-above {100 * fail_above:g}%"
        )
    if s.max_abs_err > fail_above_max:
        _fail(
            f"largest |prediction error| {100 * s.max_abs_err:.1f}% "
            f"is above --fail-above-max {100 * fail_above_max:g}%"
        )
