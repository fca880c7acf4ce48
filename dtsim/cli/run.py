"""``sim run``: simulate one configuration."""

from __future__ import annotations

import atexit
import gc
import json
from typing import Any

import click

from dtsim.cli.chakra_out import chakra_out_option, check_chakra_out
from dtsim.cli.errors import BadInput
from dtsim.cli.options import run_options, spec_from_params
from dtsim.cli.output import check_output, run_table, write_json


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
@chakra_out_option
@click.pass_context
def run(
    ctx: click.Context,
    as_json: bool,
    trace_out: str | None,
    chakra_out: str | None,
    **params: Any,
) -> None:
    """Simulate one training configuration and print its metrics.

    \b
    Examples:
      sim run --gpus 8 --scheme dp
      sim run --gpus 16 --topology dgx1 --bandwidth 25Gbps --set scheme.algorithm=hierarchical
      sim run --gpus 4 --scheme ps --topology ethernet --model vgg16 --json
      sim run --gpus 8 --scheme dp --chakra-out et/   (for ASTRA-sim)
    """
    from dtsim.cli.guard import check_work, progress_bar
    from dtsim.resolve import build_config
    from simcore.engine import simulate

    if trace_out:
        if trace_out == "-" and as_json:
            raise BadInput(
                "--trace-out: '-' (standard output) cannot be used with --json, "
                "which prints there; give a file name"
            )
        check_output("--trace-out", trace_out)
    check_chakra_out(chakra_out)
    spec = spec_from_params(ctx, params)
    config = build_config(spec, record_spans=trace_out is not None or chakra_out is not None)
    from analysis.resolve import load_preset, trace_origin_warnings

    for line in trace_origin_warnings(
        config.trace.meta, load_preset(spec.topology), spec.compute_scale
    ):
        click.echo(line, err=True)
    check_work(config)
    with progress_bar() as progress:
        result = simulate(config, progress=progress)
    _freeze_at_exit()
    if trace_out:
        from simcore.chrome import to_chrome_trace

        meta = {
            "dtsim": {k: v for k, v in result.to_dict().items() if not isinstance(v, dict | list)}
        }
        write_json(trace_out, to_chrome_trace(result.spans, result.device_names, meta))
    # With the trace on standard output, the summary goes to stderr.
    to_err = trace_out == "-"
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(run_table(result), err=to_err)
        if trace_out:
            click.echo(
                f"  chrome trace       {trace_out}  (open in https://ui.perfetto.dev)", err=to_err
            )
    if chakra_out:
        from analysis.chakra_export import RunInfo
        from dtsim import __version__
        from dtsim.cli.chakra_out import write_chakra_out

        ran = config.trace.rescale_batch(config.effective_batch_size)
        info = RunInfo(
            model=result.model,
            batch_size=config.effective_batch_size,
            device=result.gpu_model,
            dtype=config.trace.meta.dtype,
            scheme=result.scheme,
            warmup_iterations=result.warmup_iterations,
            iterations=result.iterations,
            iteration_time_s=result.iteration_time_s,
            source=f"simulated by dtsim {__version__} (sim run, {result.topology})",
            framework=f"dtsim {__version__} (simulated)",
            microbatches=int(result.extra.get("microbatches", 1) or 1),
        )
        write_chakra_out(
            chakra_out,
            result.spans,
            result.device_names,
            info,
            ran,
            lambda line: click.echo(line, err=to_err or as_json),
        )


def _freeze_at_exit() -> None:
    """Have the objects alive when the interpreter shuts down frozen (``gc.freeze``), so
    that its last collections skip them: a run leaves a trace, a result and its records,
    which nothing needs collected at exit. Registered once however often ``run`` runs in
    one process."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
