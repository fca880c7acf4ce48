"""``sim partition``: split a model into pipeline stages and predict the speedup."""

from __future__ import annotations

import json

import click

from dtsim.cli.options import setting_option
from simcore.spec import FIELDS


@click.command("partition")
@setting_option(FIELDS["model"])
@setting_option(FIELDS["gpus"])
@setting_option(FIELDS["topology"])
@click.option(
    "--method",
    type=click.Choice(["antichain", "layers", "params", "compute"]),
    default="antichain",
    show_default=True,
    help="PipeDream's antichain optimizer, or a straight pipeline with equal "
    "layer counts, parameter bytes or compute per stage.",
)
@click.option(
    "--straight",
    is_flag=True,
    help="One GPU per stage (the optimizer may otherwise replicate stages).",
)
@click.option(
    "--bandwidth",
    default=None,
    metavar="RATE",
    help="Bandwidth between stages and among a stage's replicas: 10Gbps, 100Gb/s, 25GB/s. "
    "[default: the --topology's between its first two GPUs, which sim run's pipelines use]",
)
@click.option(
    "--activations",
    is_flag=True,
    help="Count activation and gradient transfers between stages (PipeDream's "
    "flat optimizer does, its hierarchical one does not; the pipeline "
    "schemes of 'sim run' do, so add it to preview their stages).",
)
@click.option(
    "--memory-limit",
    default="",
    metavar="SIZE",
    help="Memory per GPU a stage may use, e.g. 16GiB (antichain only).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def partition(
    model: str | None,
    gpus: int | None,
    topology: str | None,
    method: str,
    straight: bool,
    bandwidth: str | None,
    activations: bool,
    memory_limit: str,
    as_json: bool,
) -> None:
    """Split a model into pipeline stages so that the slowest stage is as fast as possible.

    Prints each stage's layers, replicas, compute time, parameter bytes and the activation
    bytes crossing its output boundary, the bottleneck, and the predicted speedup over one
    GPU and over data parallelism on the same GPUs. With no --bandwidth the stages are
    cut for the links between the first two GPUs of --topology, as 'sim run' cuts its
    pipelines on the same topology.

    \b
    Examples:
      sim partition --model vgg16 --gpus 4
      sim partition --model vgg16 --gpus 4 --topology ethernet --bandwidth 10Gbps
      sim partition --model inception_v3 --gpus 8 --straight --json
      sim partition --model resnet50 --gpus 8 --method compute
    """
    from analysis.resolve import load_preset
    from dtsim.cli.output import table
    from dtsim.resolve import resolve_trace
    from simcore.config import parse_quantity
    from simcore.partition import PartitionError
    from simcore.partition import partition as run_partition
    from simcore.spec import RunSpec
    from simcore.topology import TopologySpec, build_topology
    from simcore.units import (
        format_bytes,
        format_rate,
        format_time,
        parse_rate,
        parse_size,
    )

    spec = RunSpec().replace(
        **{
            k: v
            for k, v in {"model": model, "gpus": gpus, "topology": topology}.items()
            if v is not None
        }
    )
    gpus = spec.gpus
    limit = parse_quantity(parse_size, memory_limit, "--memory-limit") if memory_limit else None
    trace = resolve_trace(spec.model)
    if bandwidth is not None:
        bw = parse_quantity(parse_rate, bandwidth, "bandwidth")
    else:
        topo = build_topology(TopologySpec(preset=load_preset(spec.topology), gpus=gpus))
        bw = topo.stage_bandwidth()
    try:
        p = run_partition(
            trace,
            gpus,
            bw,
            method=method,
            straight=straight,
            activation_term=activations,
            memory_limit_bytes=limit,
        )
    except PartitionError as exc:
        raise click.UsageError(
            f"cannot partition {trace.meta.model!r} over {gpus} GPUs: {exc}"
        ) from None
    if as_json:
        click.echo(json.dumps(p.to_dict(), indent=2))
        return
    names = [layer.name for layer in trace.layers]
    kind = "straight pipeline" if p.straight else "replicated stages allowed"
    click.echo(
        f"{method} partition of {trace.meta.model} over {gpus} GPU"
        f"{'s' if gpus != 1 else ''} ({kind}) at {format_rate(bw)}, batch "
        f"{trace.meta.batch_size}"
    )
    head = ("stage", "layers (first..last)", "replicas", "compute", "time", "params", "out act")
    rows = [head]
    for k, s in enumerate(p.stages):
        span = f"{names[s.layers[0]]}..{names[s.layers[-1]]} ({len(s.layers)})"
        rows.append(
            (
                str(k),
                span,
                str(s.replicas),
                format_time(s.compute_s),
                format_time(s.time_s),
                format_bytes(s.param_bytes),
                format_bytes(s.out_bytes) if k < len(p.stages) - 1 else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        click.echo("  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths)).rstrip())
    search = f"{p.states:,} antichain states" if p.method == "antichain" else "baseline"
    if not p.exact:
        search += " (too many for an exact search: prefixes of one topological order)"
    click.echo(
        table(
            [
                ("bottleneck", f"{format_time(p.bottleneck_s)} per batch"),
                (
                    "speedup",
                    f"{p.speedup_vs_1gpu:.2f}x over 1 GPU ({format_time(p.single_gpu_s)}), "
                    f"{p.speedup_vs_dp:.2f}x over data parallelism "
                    f"({format_time(p.data_parallel_s)})",
                ),
                ("search", f"{search} in {format_time(p.wall_s)}"),
            ]
        )
    )
    if not activations:
        click.echo(
            "  (without the activation-transfer term, as PipeDream's hierarchical "
            "optimizer; sim run's pipelines use it: add --activations to see their "
            "stages)"
        )
