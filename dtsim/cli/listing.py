"""``sim schemes``, ``sim models``, ``sim topologies``: what there is to choose from."""

from __future__ import annotations

import click

from dtsim.cli.output import table


@click.command("schemes")
@click.option("-v", "--verbose", is_flag=True, help="Also list each scheme's options.")
def schemes(verbose: bool) -> None:
    """List the training schemes (the values of --scheme)."""
    from simcore.config import describe_options
    from simcore.schemes import registry

    reg = registry()
    click.echo(table([(name, cls.summary) for name, cls in reg.items()], indent=0))
    if verbose:
        for name, cls in reg.items():
            opts = describe_options(cls.Options)
            if not opts:
                continue
            click.echo(f"\n{name} options (--set scheme.NAME=VALUE):")
            click.echo(table([(o, f"{h} [default: {d}]") for o, d, h in opts]))


@click.command("models")
def models() -> None:
    """List the built-in models (the values of --model)."""
    from simcore.units import format_time
    from traces import builtin_models, default_model, load_builtin

    rows = []
    for name, entry in builtin_models().items():
        tr = load_builtin(name)
        mark = " (default)" if name == default_model() else ""
        rows.append(
            (
                name,
                f"{entry.description}{mark}; {len(tr.layers)} layers, "
                f"{tr.param_count / 1e6:.1f}M params, batch {tr.meta.batch_size}, "
                f"{format_time(tr.compute_s)}/iteration on {tr.meta.device}",
            )
        )
    click.echo(table(rows, indent=0))


@click.command("topologies")
def topologies() -> None:
    """List the topology presets (the values of --topology)."""
    from dtsim.resolve import topology_presets
    from dtsim.spec import DEFAULT_TOPOLOGY

    rows = []
    for name, data in topology_presets().items():
        mark = " (default)" if name == DEFAULT_TOPOLOGY else ""
        rows.append((name, f"{data.get('summary', '')}{mark}"))
    click.echo(table(rows, indent=0))
