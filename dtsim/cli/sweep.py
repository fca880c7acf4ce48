"""``sim sweep``: run the cross product of lists of run settings."""

from __future__ import annotations

import sys
from typing import Any

import click

from dtsim.cli.options import out_option, setting_option
from simcore.spec import FLAG_FIELDS as SWEEP_FLAGS
from simcore.spec import flag_fields


def _list_options(f: Any) -> Any:
    """A list-valued flag for each setting that ``sim run`` takes as a flag."""
    for field in reversed(flag_fields()):
        f = setting_option(field, as_list=True)(f)
    return f


@click.command("sweep")
@_list_options
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    metavar="FILE",
    help="YAML/JSON settings; a list value is swept, e.g. 'gpus: [2, 4, 8]'.",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=V1,V2",
    help="Sweep any other setting, e.g. chunk_bytes=256KiB,1MiB or "
    "scheme.algorithm=ring,tree (repeatable).",
)
@out_option(
    "Results table (.parquet or .csv); finished points in it are skipped.",
    default="sweep.parquet",
)
@click.option(
    "-j",
    "--jobs",
    type=int,
    default=-1,
    show_default=True,
    help="Local worker processes (-1: one per core; 1: in this process).",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="tcp://HOST:PORT",
    help="Run on this Dask distributed cluster instead of local workers.",
)
@click.option("--retry-failed", is_flag=True, help="Run again the points that failed before.")
@click.option("--dry-run", is_flag=True, help="List the points and exit.")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar. [default: when stderr is a terminal]",
)
def sweep(
    config_file: str | None,
    settings: tuple[str, ...],
    out: str,
    jobs: int,
    scheduler: str | None,
    retry_failed: bool,
    dry_run: bool,
    progress: bool | None,
    **lists: str | None,
) -> None:
    """Simulate every combination of the given values and append each result to a table.

    Every flag takes a comma-separated list, --set sweeps any other field or scheme option;
    settings not given keep sim run's defaults. A point that fails is recorded with its
    error and the others go on; rerunning the same command skips finished points.

    \b
    Examples:
      sim sweep --scheme dp,ps --gpus 4 --topology ethernet \\
                --bandwidth 1Gbps,10Gbps,100Gbps --model resnet50,vgg16 --out bw.parquet
      sim sweep --scheme dp --topology ib-cluster --fidelity analytic \\
                --gpus 8,16,32,64,128 --set scheme.algorithm=ring,tree --out scale.csv
      sim sweep ... --scheduler tcp://10.0.0.5:8786
    """
    from analysis.resolve import load_config_file
    from analysis.sweep import plan_sweep, run_sweep, split_values
    from simcore.config import ConfigError
    from simcore.spec import RunSpec, apply_settings, parse_set

    base: dict[str, Any] = {}
    axes: dict[str, Any] = {}
    if config_file:
        for key, value in load_config_file(config_file).items():
            (axes if isinstance(value, list) else base)[key] = value
    for name in SWEEP_FLAGS:
        if lists.get(name) is not None:
            axes[name] = split_values(name, lists[name])
    for key, value in parse_set(settings).items():
        axes[key] = split_values(key, value)
    if scheduler is not None and "://" not in scheduler:
        raise ConfigError("scheduler", scheduler, "expected an address like tcp://HOST:PORT")
    plan = plan_sweep(apply_settings(RunSpec(), base), axes)

    if dry_run:
        from dtsim.cli.output import table

        click.echo(f"{len(plan.points)} point{'s' if len(plan.points) != 1 else ''}:")
        click.echo(table([(p.point_id, _show(p.values)) for p in plan.points]))
        return
    from dtsim.cli.output import check_output, output_errors

    check_output("--out", out)
    show = sys.stderr.isatty() if progress is None else progress
    try:
        with output_errors("--out"):
            s = run_sweep(
                plan, out, jobs=jobs, scheduler=scheduler, retry_failed=retry_failed, progress=show
            )
    except KeyboardInterrupt:
        click.echo(
            f"Interrupted: the finished points are in {out}; run the same command again to go on.",
            err=True,
        )
        raise
    click.echo(
        f"{s.points} points into {s.out}: {s.computed} computed"
        f"{f' ({s.failed} failed)' if s.failed else ''}, {s.skipped} already there; "
        f"{s.rows} rows in the file; {s.wall_s:.1f} s"
    )
    for values, error in s.errors[:10]:
        click.echo(f"  failed: {_show(values)}: {error}")
    if len(s.errors) > 10:
        click.echo(f"  ... and {len(s.errors) - 10} more (see the 'error' column)")
    if s.failed or s.failed_before:
        now = f"{s.failed} of {s.computed} computed now" if s.computed else ""
        before = f"{s.failed_before} from an earlier run" if s.failed_before else ""
        n = s.failed + s.failed_before
        err = click.ClickException(
            f"{n} of {s.points} point{'s' if s.points != 1 else ''} "
            f"failed ({'; '.join(x for x in (now, before) if x)}); "
            f"their errors are in the 'error' column of {s.out}; "
            f"fix them and rerun with --retry-failed"
        )
        err.exit_code = 1
        raise err


def _show(values: dict[str, Any] | Any) -> str:
    """``scheme=dp gpus=4 scheme.algorithm=-`` (``-``: an option the scheme does not take)."""
    return " ".join(f"{k}={'-' if v is None else v}" for k, v in values.items())
