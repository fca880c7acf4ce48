"""``sim run``: simulate one configuration."""

from __future__ import annotations

import json
from typing import Any

import click

from dtsim.cli.options import run_options, spec_from_params
from dtsim.cli.output import run_table, write_json
from traces.atomic import check_writable


@click.command("run")
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option(
    "--trace-out",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    metavar="FILE",
    help="Write a Chrome trace (open in https://ui.perfetto.dev).",
)
@click.pass_context
def run(ctx: click.Context, as_json: bool, trace_out: str | None, **params: Any) -> None:
    """Simulate one training configuration and print its metrics.

    \b
    Examples:
      sim run --gpus 8 --scheme dp
      sim run --gpus 16 --topology dgx1 --bandwidth 25Gbps --set scheme.algorithm=hierarchical
      sim run --gpus 4 --scheme ps --topology ethernet --model vgg16 --json
    """
    from dtsim.resolve import build_config
    from simcore.engine import simulate

    if trace_out:
        check_writable(trace_out)
    spec = spec_from_params(ctx, params)
    config = build_config(spec, record_spans=trace_out is not None)
    result = simulate(config)
    if trace_out:
        from simcore.chrome import to_chrome_trace

        meta = {
            "dtsim": {k: v for k, v in result.to_dict().items() if not isinstance(v, dict | list)}
        }
        write_json(trace_out, to_chrome_trace(result.spans, result.device_names, meta))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(run_table(result))
        if trace_out:
            click.echo(f"  chrome trace       {trace_out}  (open in https://ui.perfetto.dev)")
