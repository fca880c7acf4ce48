"""``sim trace show`` and ``sim trace convert``: look at traces and change their format."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
from typing import Any

import click

from dtsim.cli.errors import BadInput

FROM_FORMATS = ("auto", "dtsim", "pipedream", "kineto", "chakra")
TO_FORMATS = ("dtsim", "chrome")


def _source_options(f: Any) -> Any:
    """Options saying how to read a trace whose file does not say everything."""
    f = click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=None,
        help="Batch size, for files that do not record it (PipeDream graph.txt "
        "of non-image models, Kineto traces without dtsim metadata).",
    )(f)
    f = click.option(
        "--kineto",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        metavar="FILE",
        help="The Kineto trace (torch.profiler's JSON) recorded with the PyTorch execution "
        "trace IN (ExecutionTraceObserver's JSON): the two are linked and converted with "
        "chakra's tools (needs the chakra extra).",
    )(f)
    f = click.option(
        "--from",
        "from_fmt",
        type=click.Choice(FROM_FORMATS),
        default="auto",
        show_default=True,
        help="Input format; auto: .json is dtsim or Kineto (by content), .et or a "
        "directory Chakra execution traces, anything else PipeDream graph.txt.",
    )(f)
    return f


def _load(source: str, from_fmt: str, batch_size: int | None, kineto: str | None = None) -> Any:
    """A trace by built-in name or file, read as ``from_fmt`` (with ``kineto``: a PyTorch
    execution trace and its Kineto trace, linked by chakra's tools)."""
    from traces import builtin_models, load_builtin
    from traces.catalog import load_file
    from traces.errors import UnknownModelError

    if kineto is not None:
        if not os.path.isfile(source):
            raise BadInput(f"--kineto: IN must be the PyTorch execution trace file, not {source!r}")
        from traces.chakra import load_pytorch_pair

        return load_pytorch_pair(source, kineto, batch_size=batch_size)
    if from_fmt == "auto" and source in builtin_models() and not os.path.exists(source):
        return load_builtin(source)
    if not os.path.exists(source):
        raise UnknownModelError(source, sorted(builtin_models()))
    return load_file(source, None if from_fmt == "auto" else from_fmt, batch_size=batch_size)


@click.group("trace")
def trace() -> None:
    """Inspect and convert layer traces (dtsim JSON, PipeDream graph.txt, Kineto JSON,
    Chakra execution traces)."""


@trace.command("show")
@click.argument("source", metavar="FILE|NAME")
@_source_options
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="How many of the biggest layers to list.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def show(
    source: str,
    from_fmt: str,
    batch_size: int | None,
    kineto: str | None,
    top: int,
    as_json: bool,
) -> None:
    """Summarise a trace: metadata, layer count, totals of forward and backward time,
    parameters, activations and FLOPs, and the biggest layers by time and by parameters.

    \b
    Examples:
      sim trace show resnet50
      sim trace show resnet18.json --top 10
      sim trace show profile.json --from kineto
      sim trace show et/                  (Chakra execution traces, NAME.RANK.et)
    """
    from traces.summary import summarize

    tr = _load(source, from_fmt, batch_size, kineto)
    s = summarize(tr, top)
    if as_json:
        click.echo(
            json.dumps({"meta": dataclasses.asdict(tr.meta), **dataclasses.asdict(s)}, indent=2)
        )
        return
    click.echo(_format_summary(tr, s))


def _format_summary(tr: Any, s: Any) -> str:
    from dtsim.cli.output import table
    from simcore.units import format_bytes, format_time

    m = tr.meta
    head = f"{m.model}: batch {m.batch_size}, {m.dtype}, on {m.device}"
    rows = [
        (
            "format",
            m.source_format
            + (f", {m.framework}" if m.framework else "")
            + (f", {m.date}" if m.date else ""),
        ),
        ("layers", f"{s.layers} (+{s.inputs} input), {s.edges} edges, {s.joins} joins"),
        ("forward", format_time(s.forward_s)),
        ("backward", format_time(s.backward_s)),
        (
            "forward+backward",
            f"{format_time(s.forward_s + s.backward_s)} per batch "
            f"({m.batch_size / max(s.forward_s + s.backward_s, 1e-12):,.1f} "
            "samples/s)",
        ),
        ("parameters", f"{s.param_count:,} ({format_bytes(s.param_bytes)})"),
        ("activations", f"{format_bytes(s.activation_bytes)} (sum of layer outputs)"),
        (
            "FLOPs",
            "unknown" if s.flops is None else f"{s.flops / 1e9:,.2f} GFLOP forward per batch",
        ),
    ]
    out = [head, table(rows)]
    if m.provenance:
        out.append(
            textwrap.fill(
                m.provenance, width=96, initial_indent="  provenance: ", subsequent_indent="    "
            )
        )

    def ranking(title: str, items: Any, fmt: Any) -> None:
        if not items:
            return
        out.append(f"  biggest by {title}:")
        out.append(
            table(
                [
                    (i.name, f"{fmt(i.value):>10}  {100 * i.fraction:5.1f}%  {i.op[:48]}")
                    for i in items
                ],
                indent=4,
            )
        )

    ranking("time (forward+backward)", s.by_time, format_time)
    ranking("parameters", s.by_params, format_bytes)
    return "\n".join(out)


@trace.command("convert")
@click.argument("source", metavar="IN")
@click.argument("dest", metavar="OUT", type=click.Path(dir_okay=False, writable=True))
@_source_options
@click.option(
    "--to",
    "to_fmt",
    type=click.Choice(TO_FORMATS),
    default="dtsim",
    show_default=True,
    help="Output format: dtsim JSON, or a Chrome trace of one training step "
    "(open in https://ui.perfetto.dev).",
)
@click.option(
    "--model", "model_name", default=None, help="Model name to record. [default: the input's]"
)
def convert(
    source: str,
    dest: str,
    from_fmt: str,
    batch_size: int | None,
    kineto: str | None,
    to_fmt: str,
    model_name: str | None,
) -> None:
    """Convert a trace (file or built-in name) to dtsim JSON or a Chrome trace.

    Chakra execution traces are read as converted from a PyTorch run (chakra_converter)
    or as written by 'sim run --chakra-out'; a PyTorch run's own pair of files (the
    ExecutionTraceObserver JSON and the Kineto trace) is linked and converted with
    chakra's tools first (--kineto). See docs/traces.md.

    \b
    Examples:
      sim trace convert graph.txt vgg16.json --from pipedream
      sim trace convert kineto-profile.json resnet18.json
      sim trace convert resnet50 resnet50-timeline.json --to chrome
      sim trace convert et.json mynet.json --kineto kineto.json
      sim trace convert mynet.0.et mynet.json
    """
    from dtsim.cli.output import check_output, write_json
    from traces import save_trace
    from traces.model import Trace

    check_output("OUT", dest)
    tr = _load(source, from_fmt, batch_size, kineto)
    if model_name:
        tr = Trace(dataclasses.replace(tr.meta, model=model_name), tr.layers, tr.edges)
    if to_fmt == "chrome":
        from traces.summary import to_chrome

        write_json(dest, to_chrome(tr))
    else:
        save_trace(tr, dest)
    click.echo(
        f"wrote {dest}: {tr.meta.model} ({tr.meta.source_format} -> {to_fmt}), "
        f"{len(tr.layers)} layers, batch {tr.meta.batch_size}"
    )
