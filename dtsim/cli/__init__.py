"""The ``sim`` command. Subcommands live in their own modules and are imported only
when used, so ``sim run`` starts fast."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from dtsim import __version__

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("dtsim.cli.run", "Simulate one training configuration."),
    "schemes": ("dtsim.cli.listing", "List the training schemes."),
    "models": ("dtsim.cli.listing", "List the built-in models (traces)."),
    "topologies": ("dtsim.cli.listing", "List the topology presets."),
    "real": ("dtsim.cli.real", "Run a scheme for real with torch.distributed and measure it."),
    "calibrate": (
        "dtsim.cli.calibrate",
        "Measure this machine's cluster (latency, goodput, CPU costs) into a topology file.",
    ),
    "profile": ("dtsim.cli.profile", "Profile a zoo model into a layer trace (needs torch)."),
    "trace": ("dtsim.cli.trace", "Show or convert layer traces (dtsim, PipeDream, Kineto)."),
    "partition": ("dtsim.cli.partition", "Split a model into pipeline stages."),
    "schedule": ("dtsim.cli.schedule", "Print a pipeline schedule as a rank-by-step grid."),
    "sweep": ("dtsim.cli.sweep", "Run a what-if sweep over lists of settings."),
    "plot": ("dtsim.cli.plot", "Plot sweep results or a Chrome trace."),
    "report": ("dtsim.cli.report", "Reproduce the seed papers' comparisons as a report."),
    "train": ("dtsim.cli.train", "Convergence under staleness on real data, time to accuracy."),
    "validate": ("dtsim.cli.validate", "Check the simulator against real runs over a matrix."),
    "clean": ("dtsim.cli.clean", "Remove what killed real runs left (namespaces, ranks, files)."),
}
"""Subcommand -> (module, one-line help). The module defines a click command ``NAME``
(``-`` in the name becomes ``_``)."""


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[cmd_name][0])
        return getattr(module, cmd_name.replace("-", "_"))

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; a user error it raises (bad trace file, unit, config...)
        becomes a one-line click error, whoever called the group (``main``, CliRunner)."""
        from dtsim.cli.errors import as_click_error, with_output_option
        from traces.atomic import OutputPathError

        args = list(ctx.args)
        try:
            return super().invoke(ctx)
        except Exception as exc:
            name = ctx.invoked_subcommand
            command = self.get_command(ctx, name) if name else None
            err = as_click_error(exc, command)
            if err is None or err is exc:
                raise
            if isinstance(exc, OutputPathError):
                err.message = with_output_option(err.message, args)
            raise err from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_m, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="sim")
def cli() -> None:
    """dtsim: what happens if I train this model with this scheme on this cluster?

    Simulates data-parallel, parameter-server and pipeline training schemes on modelled
    GPU clusters from profiled layer traces. Start with:

        sim run --gpus 8 --scheme p3
    """


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the group; a user error (see :meth:`LazyGroup.invoke`) is one line
    on stderr and a non-zero exit (2 for bad input), without a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        # ``sim`` alone: its normal help, on stdout, and success (click would report the
        # help as a usage error).
        with click.Context(cli, info_name="sim") as ctx:
            click.echo(cli.get_help(ctx))
        sys.exit(0)
    try:
        rv: Any = cli.main(args=args, prog_name="sim", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"Error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
