"""``sim plot``: a figure of sweep results or of a Chrome trace."""

from __future__ import annotations

import os

import click

from dtsim.cli.options import out_option


@click.command("plot")
@click.argument("results", metavar="RESULTS", type=click.Path(dir_okay=False))
@click.option(
    "--kind",
    default="auto",
    show_default=True,
    type=click.Choice(
        ["auto", "line", "bar", "speedup", "throughput", "utilization", "prediction", "gantt"]
    ),
    help="A ready plot, or line/bar of --y against --x (auto: line for a numeric "
    "x, bars otherwise). prediction: a validation's measured and predicted --y "
    "(scaling_efficiency, speedup or iteration_time_s) against the ranks or bandwidth.",
)
@click.option("--x", "x", default=None, metavar="COLUMN", help="Column on the x axis.")
@click.option("--y", "y", default=None, metavar="COLUMN", help="Column on the y axis.")
@click.option("--hue", default=None, metavar="COLUMN", help="Colour by this column.")
@click.option("--col", default=None, metavar="COLUMN", help="One panel per value of it.")
@click.option(
    "--where",
    multiple=True,
    metavar="COLUMN=VALUE",
    help="Keep only these rows (repeatable); for --kind gantt: device, stream, kind or iteration.",
)
@click.option("--title", default=None, help="Figure title.")
@out_option("Figure file (.png, .svg, .pdf). [default: RESULTS-KIND.png]", metavar="FIG")
def plot(
    results: str,
    kind: str,
    x: str | None,
    y: str | None,
    hue: str | None,
    col: str | None,
    where: tuple[str, ...],
    title: str | None,
    out: str | None,
) -> None:
    """Plot a sweep's results (.parquet, .csv, or sim run --json output), a
    validation's (--kind prediction: sim validate --device emulated's results.csv) or,
    with --kind gantt, the timeline of a sim run --trace-out file.

    \b
    Examples:
      sim plot bw.parquet --x bandwidth --y throughput_samples_s --hue scheme --col model
      sim plot bw.parquet --kind throughput --out throughput.svg
      sim plot scale.csv --kind speedup --where model=resnet50
      sim plot bw.parquet --kind utilization --where bandwidth=1Gbps --where model=vgg16
      sim plot run.json --kind gantt --where iteration=1
      sim plot scaling/results.csv --kind prediction --y scaling_efficiency
    """
    import matplotlib

    matplotlib.use("Agg")
    from analysis.plots import plot_results, save_figure
    from dtsim.spec import parse_set

    filters = parse_set(where, flag="--where", example="model=vgg16") if where else {}
    fig = plot_results(results, kind, x=x, y=y, hue=hue, col=col, where=filters, title=title)
    if out is None:
        stem = os.path.splitext(results)[0]
        out = f"{stem}-{kind if kind not in ('auto', 'line', 'bar') else y}.png"
    save_figure(fig, out)
    click.echo(f"wrote {out}")
