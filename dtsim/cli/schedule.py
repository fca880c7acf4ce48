"""``sim schedule``: a pipeline scheme's schedule as a rank-by-step grid."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from dtsim.cli.options import LazyChoice


def pipeline_schemes() -> tuple[str, ...]:
    """The registered schemes that run a schedule (subclasses of ``PipelineScheme``)."""
    from simcore.schemes import registry
    from simcore.schemes._pipeline import PipelineScheme

    return tuple(n for n, cls in registry().items() if issubclass(cls, PipelineScheme))


@click.command("schedule")
@click.option(
    "--scheme",
    type=LazyChoice(pipeline_schemes),
    default="pipedream",
    show_default=True,
    help="Pipeline scheme.",
)
@click.option(
    "--stages",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Pipeline stages (one GPU each unless --replicas says otherwise); for the "
    "virtual-stage schemes the GPUs, each running the scheme's chunks (--set chunks=V for "
    "interleaved, looped-bfs, zb-interleaved; two in a V for zbv and dualpipev).",
)
@click.option(
    "--replicas",
    default="",
    metavar="R1,R2,...",
    help="GPUs per stage, e.g. 2,1,1 (overrides --stages).",
)
@click.option(
    "--microbatches",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Micro-batches per iteration.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Iterations to lay out.",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Scheme option, e.g. recompute=true (gpipe), stash=false (pipedream).",
)
@click.option(
    "--from-file",
    "from_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="FILE",
    help="Check a schedule written in the text form (as --actions prints it).",
)
@click.option("--actions", is_flag=True, help="Print each rank's action list too.")
@click.option(
    "--torch",
    "torch_form",
    is_flag=True,
    help="With --actions: print the lists in torch.distributed.pipelining's action strings "
    "(CSV, one row per rank: 2F0, 1I3, 0SEND_F1, ...).",
)
@click.option(
    "--compare-torch",
    "compare_torch",
    is_flag=True,
    help="Also lay out torch's own generator for the scheme (interleaved, looped-bfs, "
    "zb-interleaved, zb-h1, zbv, dualpipev; needs torch) and say whether every rank's "
    "passes are the same.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Show at most this many steps of the grid.",
)
def schedule(
    scheme: str,
    stages: int,
    replicas: str,
    microbatches: int,
    iterations: int,
    settings: tuple[str, ...],
    from_file: str | None,
    actions: bool,
    torch_form: bool,
    compare_torch: bool,
    steps: int | None,
) -> None:
    """Print a pipeline schedule as a rank-by-step grid, after validating it.

    A step is one forward (F), backward (B) or recompute (R) pass of a micro-batch;
    communication and weight updates take no step; '.' is idle. Validation checks every
    forward comes before its backward, every send has its receive, every replica joins its
    stage's all-reduces, and nothing deadlocks.

    \b
    Examples:
      sim schedule --scheme pipedream --stages 4 --microbatches 8
      sim schedule --scheme gpipe --stages 4 --microbatches 4 --set recompute=true
      sim schedule --scheme pipedream --replicas 2,1,1 --microbatches 6 --actions
      sim schedule --scheme zbv --stages 4 --microbatches 8 --compare-torch
      sim schedule --scheme interleaved --set chunks=3 --actions --torch
      sim schedule --from-file torch_schedule.csv
    """
    from dtsim.spec import parse_set
    from simcore.config import ConfigError, options_from_mapping
    from simcore.schedule import Schedule, ScheduleError, stages_from_replicas
    from simcore.schemes import get_scheme

    try:
        if from_file:
            try:
                with open(from_file, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                from traces.errors import unreadable

                raise ConfigError("--from-file", from_file, unreadable(exc)) from None
            from simcore.schedule import from_torch_csv

            if "(stage" in text:
                s = Schedule.from_text(text, name=from_file)
            else:  # torch's CSV
                s = from_torch_csv(text, name=from_file)
        else:
            if replicas:
                try:
                    reps = [int(x) for x in replicas.split(",")]
                except ValueError:
                    reps = []
                if not reps or min(reps) < 1:
                    raise ConfigError(
                        "replicas",
                        replicas,
                        "expected positive integers separated by commas, e.g. 2,1,1",
                    )
            else:
                reps = [1] * stages
            from dtsim.cli.guard import check_schedule

            check_schedule(sum(reps), microbatches, iterations)
            cls = get_scheme(scheme)
            source = click.get_current_context().get_parameter_source("microbatches")
            fixed = cls.features.for_options(cls.Options()).microbatches
            if fixed and source == ParameterSource.COMMANDLINE:
                raise click.BadParameter(
                    f"{scheme} runs {fixed} micro-batch per iteration, "
                    "whatever is asked; leave --microbatches out",
                    param_hint="'--microbatches'",
                )
            if fixed:
                microbatches = fixed
            given = {k.removeprefix("scheme."): v for k, v in parse_set(settings).items()}
            opts = options_from_mapping(cls.Options, given, prefix="--set ")
            placed = cls.place(stages_from_replicas(reps), opts)
            s = cls.make_schedule(placed, microbatches, iterations, opts)
        s.validate()
    except ScheduleError as exc:
        lines = str(exc).splitlines()
        if len(lines) > 1:
            click.echo("\n".join(lines[1:]), err=True)
        raise click.UsageError(f"invalid schedule: {lines[0]}") from None
    mbs = "micro-batch" if s.microbatches == 1 else "micro-batches"
    if s.virtual:
        on = "; ".join(
            f"GPU {r}: {','.join(map(str, st))}" for r, st in enumerate(s.local_stages())
        )
        shape = f"on {s.ranks} GPUs, {on}"
    else:
        shape = "+".join(str(len(r)) for r in s.stages) + " GPUs"
    click.echo(f"{s.name}: {len(s.stages)} stages ({shape}), {s.microbatches} {mbs}, valid")
    click.echo(s.grid(steps))
    if actions:
        click.echo("")
        if torch_form:
            from simcore.schedule import to_torch_csv

            click.echo(to_torch_csv(s), nl=False)
        else:
            click.echo(s.to_text())
    if compare_torch:
        _compare_torch(s, scheme if not from_file else "", steps)


def _compare_torch(ours: Any, scheme: str, steps: int | None) -> None:
    """Print torch's grid for the same shape and whether its passes equal ours, per rank
    (the first iteration's; exit 2 where torch has no such schedule or refuses the shape)."""
    from dtsim.cli.errors import BadInput
    from realrun.torch_schedules import TORCH_CLASSES, torch_order
    from simcore.schedule import ScheduleError, compute_passes, from_torch

    if scheme not in TORCH_CLASSES:
        raise BadInput(
            f"--compare-torch: torch has no generator for {scheme or 'a file'}; "
            f"it has {', '.join(TORCH_CLASSES)}"
        )
    ranks = ours.ranks
    chunks = len(ours.stages) // ranks
    try:
        rows = torch_order(scheme, ranks, chunks, ours.per_iteration)
        theirs = from_torch(rows, f"torch {TORCH_CLASSES[scheme]}")
    except (ValueError, RuntimeError, ScheduleError) as exc:
        raise BadInput(f"--compare-torch: torch refuses this shape: {exc}") from None
    click.echo("")
    click.echo(f"{theirs.name} (torch {_torch_version()}):")
    click.echo(theirs.grid(steps))
    differ = [r for r in range(ranks) if compute_passes(ours, r, 0) != rows[r]]
    click.echo("")
    if differ:
        click.echo(f"passes differ from torch's on ranks {differ}")
        raise SystemExit(1)
    click.echo(f"every rank's passes equal torch's ({sum(map(len, rows))} passes)")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
