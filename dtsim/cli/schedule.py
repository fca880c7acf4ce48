"""``sim schedule``: a pipeline scheme's schedule as a rank-by-step grid."""

from __future__ import annotations

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
    help="Pipeline stages (one GPU each unless --replicas says otherwise).",
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
            s = Schedule.from_text(text, name=from_file)
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
            s = cls.make_schedule(stages_from_replicas(reps), microbatches, iterations, opts)
        s.validate()
    except ScheduleError as exc:
        lines = str(exc).splitlines()
        if len(lines) > 1:
            click.echo("\n".join(lines[1:]), err=True)
        raise click.UsageError(f"invalid schedule: {lines[0]}") from None
    shape = "+".join(str(len(r)) for r in s.stages)
    mbs = "micro-batch" if s.microbatches == 1 else "micro-batches"
    click.echo(f"{s.name}: {len(s.stages)} stages ({shape} GPUs), {s.microbatches} {mbs}, valid")
    click.echo(s.grid(steps))
    if actions:
        click.echo("")
        click.echo(s.to_text())
