"""``sim calibrate``: measure this machine's (emulated) cluster and write a topology file."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from dtsim.cli.errors import BadInput
from dtsim.cli.options import out_option
from dtsim.cli.output import check_output, table
from simcore.units import UnitError, parse_rate, parse_size


def _rate(value: str | None) -> float | None:
    if value is None or value.strip().lower() in ("", "none", "unshaped"):
        return None
    try:
        return parse_rate(value)
    except UnitError as err:
        raise BadInput(
            f"--bandwidth: {value!r} is not allowed; give {err.expected or 'a rate such as 1Gbps'}"
        ) from None


def _int_list(flag: str, value: str, low: int, high: int, what: str) -> list[int]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    try:
        out = [parse_size(v) if flag == "--sizes" else int(v) for v in items]
    except (UnitError, ValueError):
        out = []
    if not out or any(not low <= v <= high for v in out):
        raise BadInput(f"{flag}: {value!r} is not allowed; give {what}")
    return out


@click.command("calibrate")
@click.option(
    "--cluster",
    type=click.Choice(["netns", "local"]),
    default="netns",
    show_default=True,
    help="netns: one network namespace per host with links shaped to --bandwidth, as "
    "'sim real --cluster netns' builds them (root); local: loopback, unshaped.",
)
@click.option(
    "--bandwidth",
    default=None,
    metavar="RATE",
    help="tbf rate of every link, each direction (e.g. 1Gbps, 200Mbps); netns only. "
    "[default: unshaped]",
)
@click.option(
    "--hosts",
    type=click.IntRange(2, 64),
    default=2,
    show_default=True,
    help="Ping-pong between host 0 and each of hosts 1..N-1.",
)
@click.option(
    "--flow-hosts",
    type=click.IntRange(2, 64),
    default=8,
    show_default=True,
    help="Hosts that send at once (a ring of flows) to measure how evenly concurrent "
    "flows share the shaped links; netns with --bandwidth only.",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Timed repetitions per message size after one warm-up (4x for sizes up to 64 KiB).",
)
@click.option(
    "--sizes",
    default=None,
    metavar="LIST",
    help="Message sizes, comma-separated (e.g. 4,1KiB,1MiB,16MiB). [default: 4 B to 16 MiB, "
    "9 sizes]",
)
@click.option(
    "--allreduce-ranks",
    default="2,3,4",
    show_default=True,
    metavar="LIST",
    help="Time gloo's all-reduce on the first P hosts for each P (comma-separated; "
    "'none' to skip).",
)
@out_option(
    "The topology file to write (for 'sim run --topology FILE').", default="calibration.yaml"
)
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as one JSON object.")
def calibrate(
    cluster: str,
    bandwidth: str | None,
    hosts: int,
    flow_hosts: int,
    repeats: int,
    sizes: str | None,
    allreduce_ranks: str,
    out: str,
    as_json: bool,
) -> None:
    """Calibrate the simulator on this machine: microbenchmarks on real gloo processes.

    Times point-to-point ping-pongs over message sizes on links shaped to --bandwidth and
    unshaped (wall time and CPU seconds per message), two TCP flows sharing a shaped
    link, gloo all-reduces (also beside threads that keep every core computing),
    one-thread reductions, copies and matmuls, processes that compute and sleep in
    turn (the machine's scheduler), spinning processes beside a shaped exchange
    (what the link's packet work takes from them), and a ring of flows from every host
    at once (how evenly concurrent flows share the links); fits the network's latency and
    goodput, the CPU cost per message, per byte sent and per byte reduced, how long a
    sending connection keeps a link before a new one shares it, how soon an idle core
    takes over a thread queued on a busier one, how long a woken thread waits for a
    core, the shaped link's CPU per byte, and concurrent flows' mean share and spread;
    writes them as a topology file. Takes about six minutes at 100Mbps with the
    defaults.

    \b
    Examples:
      sim calibrate --cluster netns --bandwidth 1Gbps --out calib.yaml
      sim calibrate --cluster local --repeats 3
      sim run --topology calib.yaml --gpus 2 --scheme dp --model mlp_small
    """
    from realrun.calibration import CalibrationError
    from realrun.calibration.preset import write_calibration
    from realrun.calibration.report import describe
    from realrun.calibration.run import DEFAULT_SIZES_BYTES
    from realrun.calibration.run import calibrate as run_calibration

    rate = _rate(bandwidth)
    if rate is not None and cluster == "local":
        raise BadInput(
            f"--bandwidth: {bandwidth!r} is not allowed with --cluster local (loopback is "
            "unshaped); use --cluster netns or leave --bandwidth out"
        )
    size_list = (
        list(DEFAULT_SIZES_BYTES)
        if sizes is None
        else _int_list("--sizes", sizes, 4, 1 << 30, "sizes from 4 B to 1 GiB, e.g. 4,1KiB,1MiB")
    )
    if len({4 * (s // 4) for s in size_list}) < 2:
        raise BadInput(f"--sizes: {sizes!r} is not allowed; give at least two different sizes")
    ar = (
        []
        if allreduce_ranks.strip().lower() in ("none", "")
        else _int_list("--allreduce-ranks", allreduce_ranks, 2, 64, "integers from 2 to 64")
    )
    check_output("--out", out)
    from dtsim.cli.clean import clean_stale

    clean_stale()

    from tqdm import tqdm

    bar = tqdm(
        total=1,
        desc="calibrating",
        unit="step",
        leave=False,
        disable=not sys.stderr.isatty(),
    )

    def progress(done: int, total: int, what: str) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(what, refresh=False)
        bar.refresh()

    try:
        preset = run_calibration(
            cluster=cluster,
            bandwidth_bytes_per_s=rate,
            hosts=hosts,
            sizes_bytes=size_list,
            repeats=repeats,
            allreduce_ranks=ar,
            progress=progress,
            flow_hosts=flow_hosts,
        )
    except ValueError as err:
        raise BadInput(str(err)) from None
    except CalibrationError as err:
        failed = click.ClickException(str(err))
        failed.exit_code = 1
        raise failed from None
    finally:
        bar.close()
    write_calibration(preset, out)
    if as_json:
        click.echo(json.dumps(preset, indent=1))
        return
    click.echo(_summary(preset, out, describe(preset)))


def _summary(preset: dict[str, Any], out: str, rows: list[tuple[str, str]]) -> str:
    head = f"{preset['name']} | {preset['measured']['cluster']} | calibrated"
    return head + "\n" + table([*rows, ("wrote", f"{out}  (sim run --topology {out})")])
