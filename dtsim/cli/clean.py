"""``sim clean``: remove what real runs killed without cleaning up left on this machine."""

from __future__ import annotations

import click


def clean_stale() -> None:
    """Remove what dead runs left (:func:`realrun.stale.remove_stale`) and say so in one
    line on stderr; silent when there was nothing. ``sim real``, ``sim calibrate`` and
    ``sim validate`` call it before they start."""
    from realrun.stale import remove_stale

    removed = remove_stale()
    if removed:
        click.echo(f"note: {removed.describe()}", err=True)


@click.command("clean")
@click.option(
    "--prefix",
    default=None,
    metavar="NAME",
    help="Namespace prefix of the runs to clean up after. "
    "[default: $DTSIM_NETNS_PREFIX, else dtsim]",
)
@click.option("-v", "--verbose", is_flag=True, help="List every item removed.")
def clean(prefix: str | None, verbose: bool) -> None:
    """Remove what real runs left when they were killed without a chance to clean up
    (kill -9, a crash): their network namespaces and the processes inside, rank
    processes still running, and their temporary folders.

    Only what belongs to runs whose process is gone is removed; runs in progress,
    yours or anyone's, are left alone. 'sim real', 'sim calibrate' and 'sim validate'
    do the same when they start.
    """
    from realrun.stale import netns_prefixes, remove_stale

    prefixes = (prefix, prefix + "l") if prefix else netns_prefixes()
    try:
        removed = remove_stale(prefixes)
    except ValueError as exc:  # a prefix netns would never make
        raise click.BadParameter(str(exc), param_hint="'--prefix'") from None
    if not removed:
        click.echo("nothing to clean: no run left anything behind")
        return
    click.echo(removed.describe())
    if verbose:
        for item in [*removed.namespaces, *map(str, removed.processes), *removed.folders]:
            click.echo(f"  {item}")
