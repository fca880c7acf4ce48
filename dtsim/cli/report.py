"""``sim report``: the seed papers' comparisons as a Markdown report with figures."""

from __future__ import annotations

import sys

import click

from dtsim.cli.options import out_option


@click.command("report")
@out_option(
    "Folder for report.md, figures/ and data/ (created if needed).",
    folder=True,
    default="report",
    dest="out_dir",
)
@click.option(
    "--quick", is_flag=True, help="Fewer models, bandwidths and GPU counts (a few seconds)."
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
    "--emulated",
    "emulated",
    multiple=True,
    metavar="DIR",
    type=click.Path(exists=True),
    help="Add the comparisons measured on emulated devices beside their predictions, "
    "from a 'sim validate --device emulated --out DIR' folder (repeatable).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show progress bars. [default: when stderr is a terminal]",
)
def report(
    out_dir: str, quick: bool, jobs: int, emulated: tuple[str, ...], progress: bool | None
) -> None:
    """Run the seed papers' comparisons on the simulator and write a Markdown report.

    P3 against the parameter server across bandwidths; GossipGraD against all-reduce from
    8 to 1024 GPUs; the pipeline schemes against data parallelism on 4 GPUs; the antichain
    partitioner's balance for ten models on 4 and 8 GPUs. Each comparison runs with the
    schemes this build has and says which are missing. A rerun computes only what is
    missing (the sweeps' data stays in DIR/data).

    \b
    Examples:
      sim report
      sim report --quick --out /tmp/report
      sim report --emulated validation-emulated/ --emulated scaling/
    """
    import matplotlib

    matplotlib.use("Agg")
    from analysis.report import build_report

    if jobs == 0 or jobs < -1:
        raise click.BadParameter(
            f"{jobs} is not allowed; use -1 (one per core) or a positive number",
            param_hint="'--jobs'",
        )
    from dtsim.cli.output import output_folder

    show = sys.stderr.isatty() if progress is None else progress
    extra: list[str] = []
    if emulated:
        from analysis.emulated_report import emulated_section

        extra.append(emulated_section(emulated))
    # data/ keeps the finished sweeps of a failed report (a rerun computes only the rest)
    with output_folder("--out", out_dir, keep_partial=True):
        _check_out_dir(out_dir)
        s = build_report(out_dir, quick=quick, jobs=jobs, progress=show, extra_sections=extra)
    click.echo(f"wrote {s.path} ({s.computed} points simulated, {s.wall_s:.1f} s)")
    for title, what in s.missing.items():
        click.echo(f"  incomplete: {title} (missing {what})")


def _check_out_dir(out_dir: str) -> None:
    """Create ``out_dir`` (and ``figures/``, ``data/`` in it) or fail with a one-line
    error (exit 2) before any work starts."""
    import os

    from dtsim.cli.errors import BadInput

    try:
        for sub in ("", "figures", "data"):
            os.makedirs(os.path.join(out_dir, sub), exist_ok=True)
        if not os.access(out_dir, os.W_OK):
            raise PermissionError(13, "Permission denied", out_dir)
    except OSError as exc:
        raise BadInput(
            f"--out: {out_dir!r} cannot be used as the report folder: "
            f"{exc.strerror or exc}; give a folder that can be created or "
            f"written"
        ) from None
