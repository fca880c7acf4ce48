"""Options shared by the commands that describe a run (``sim run``, later ``sim sweep``),
and turning them into a :class:`~dtsim.spec.RunSpec`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click
from click.core import ParameterSource

from dtsim.spec import (
    DEFAULT_GPUS,
    DEFAULT_TOPOLOGY,
    FLAG_FIELDS,
    RunSpec,
    apply_settings,
    load_config_file,
    parse_set,
)
from simcore.schemes import scheme_names


def run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with the options that describe one run."""
    schemes = list(scheme_names())
    opts = [
        click.option("--gpus", type=click.IntRange(min=1), default=DEFAULT_GPUS,
                     show_default=True, help="Number of GPUs."),
        click.option("--scheme", type=click.Choice(schemes), default="dp", show_default=True,
                     help="Training scheme (see 'sim schemes')."),
        click.option("--model", default="", metavar="NAME|FILE",
                     help="Built-in model (see 'sim models') or trace file. [default: resnet50]"),
        click.option("--topology", default=DEFAULT_TOPOLOGY, show_default=True,
                     metavar="NAME|FILE", help="Topology preset (see 'sim topologies') or "
                                               "preset YAML file."),
        click.option("--bandwidth", default="", metavar="RATE",
                     help="Inter-node link rate, e.g. 10Gbps, 100Gb/s, 25GB/s. "
                          "[default: the preset's]"),
        click.option("--batch-size", type=click.IntRange(min=1), default=None,
                     help="Samples per model replica per iteration (per GPU for data "
                          "parallelism). [default: the trace's]"),
        click.option("--iterations", type=click.IntRange(min=1), default=5, show_default=True,
                     help="Measured iterations (after one warm-up iteration)."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Random seed (used with --set compute_jitter=CV)."),
        click.option("--fidelity", type=click.Choice(["detailed", "analytic"]),
                     default="detailed", show_default=True,
                     help="Network model: chunked link queues, or closed forms (fast, for "
                          "thousands of GPUs)."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     default=None, metavar="FILE",
                     help="YAML/JSON file of settings (same keys as --set)."),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Any other setting, e.g. warmup_iterations=2, chunk_bytes=4MiB, "
                          "nic_per_gpu=true, scheme.algorithm=tree (repeatable)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def spec_from_params(ctx: click.Context, params: dict[str, Any]) -> RunSpec:
    """The spec: defaults, then ``--config``, then flags given explicitly, then ``--set``."""
    merged: dict[str, Any] = {}
    if params.get("config_file"):
        if not os.path.exists(params["config_file"]):
            raise click.BadParameter(f"{params['config_file']!r} does not exist",
                                     param_hint="'--config'")
        merged.update(load_config_file(params["config_file"]))
    for name in FLAG_FIELDS:
        source = ctx.get_parameter_source(name)
        if source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT) \
                or name not in merged:
            value = params.get(name)
            if value is not None:
                merged[name] = value
    merged.update(parse_set(params.get("settings") or ()))
    return apply_settings(RunSpec(), merged)
