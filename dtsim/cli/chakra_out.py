"""``--chakra-out DIR`` of ``sim run`` and ``sim real``: the run as Chakra execution traces."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import click

from dtsim.cli.errors import BadInput

chakra_out_option = click.option(
    "--chakra-out",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Write the run as Chakra execution traces, one NAME.RANK.et per rank (for "
    "ASTRA-sim; 'sim trace show DIR' reads them back). Needs the chakra extra.",
)


def check_chakra_out(directory: str | None) -> None:
    """Refuse (exit 2, one line) before the run: a ``--chakra-out`` that is a file, or
    without ``mlc-chakra`` installed."""
    if directory is None:
        return
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise BadInput(f"--chakra-out: {directory!r} is a file; give a directory")
    from traces.chakra import INSTALL_HINT, available

    if not available():
        raise BadInput(f"--chakra-out needs the chakra extra: {INSTALL_HINT}")


def file_stem(model: str) -> str:
    """The ``NAME`` of the rank files for a model name or path (``resnet50``,
    ``mynet.json`` -> ``mynet``)."""
    base = os.path.basename(model.rstrip("/")) or "run"
    stem = base.split(".")[0] if base.endswith((".json", ".txt", ".et")) else base
    return re.sub(r"[^A-Za-z0-9_-]+", "_", stem) or "run"


def write_chakra_out(
    directory: str,
    spans: Sequence[Sequence[Any]],
    device_names: Sequence[str],
    info: Any,
    trace: Any,
    echo: Callable[[str], None],
) -> None:
    """Write the run's ETs (:func:`analysis.chakra_export.write`) and say where."""
    from analysis.chakra_export import write

    paths = write(directory, file_stem(info.model), spans, device_names, info, trace)
    first = os.path.basename(paths[0]).rsplit(".", 2)[0]
    echo(
        f"  chakra traces      {directory}/{first}.{{0..{len(paths) - 1}}}.et  (+ comm_groups.json)"
    )
