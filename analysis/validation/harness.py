"""The harness: a validation case on both sides, and its real runs kept.

:func:`sim_config` is a case's simulated configuration (the profiled trace on the
calibrated preset), :func:`make_job` its real run (a pipeline on the plan of that
configuration, so both run the same stages), and :func:`netns_runner` runs a job
``repeats`` times on an emulated cluster whose links are shaped to the case's rate.
Each real run's records are kept gzipped in the output folder (:func:`records_path`,
:func:`keep_records`, :func:`load_records`), and :func:`kept_repeats` walks them by
the rows of the validation's table (:func:`table_path`) for the scripts that read them
again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from analysis.validation.matrix import Case, case_from_row
from realrun.calibration.fits import segment_bytes
from realrun.owner import temp_prefix
from simcore.config import ConfigError


def sim_config(
    case: Case, trace_file: str, topology_file: str, *, record_spans: bool = True
) -> Any:
    """The simulator's configuration of ``case``: the profiled trace on the calibrated
    preset (whose fitted link rate and latency are used as they are), no device
    rescaling, and the network cut into the calibration's chunks
    (:func:`realrun.calibration.fits.segment_bytes`): a message crosses two shaped hops (its
    sender's link, then its receiver's), and TCP pipelines them segment by segment (or
    frame by frame), where 1 MiB chunks stored and forwarded would double a message's
    time."""
    from analysis.resolve import build_config, load_preset
    from simcore.spec import RunSpec

    settings: dict[str, Any] = {
        "scheme": case.scheme,
        "gpus": case.ranks,
        "model": trace_file,
        "topology": topology_file,
        "batch_size": case.batch_size,
        "iterations": case.measured_iterations,
        "warmup_iterations": case.warmup_iterations,
        "compute_scale": 1.0,
        "chunk_bytes": segment_bytes(load_preset(topology_file)),
        # a calibration measured at another rate is moved to the case's
        # (analysis.resolve.preset_at_rate); at its own rate nothing changes
        "bandwidth": case.bandwidth_bytes_per_s,
    }
    settings.update({f"scheme.{k}": v for k, v in case.options})
    return build_config(RunSpec().replace(**settings), record_spans=record_spans)


def make_job(case: Case, config: Any, *, timeout_s: float = 60.0) -> Any:
    """The real run of ``case`` (:func:`realrun.job.job_from_spec`); a pipeline gets the
    plan of the simulated configuration ``config`` (:func:`realrun.job.pipeline_of`), so
    both run the same stages (``ConfigError`` naming the batch size when a real
    micro-batch would not hold whole samples; the simulator's own refusals as they are)."""
    import dataclasses

    from realrun.job import JobError, job_from_spec

    opts = {f.name: getattr(config.options, f.name) for f in dataclasses.fields(config.options)}
    try:
        return job_from_spec(
            case.scheme,
            case.ranks,
            opts,
            plan_config=config,
            model=case.model,
            input_shape=case.input_shape,
            batch_size=case.batch_size,
            iterations=case.measured_iterations,
            warmup_iterations=case.warmup_iterations,
            seed=0,
            optimizer=config.optimizer,
            backend="gloo",
            timeout_s=timeout_s,
        )
    except ConfigError:  # the simulator's refusal names its own setting
        raise
    except ValueError as exc:  # the plan: whole samples per micro-batch
        if isinstance(exc, JobError) and exc.field != "batch_size":
            raise
        why = exc.text if isinstance(exc, JobError) else str(exc)
        raise ConfigError("batch_size", case.batch_size, why) from None


RealRunner = Callable[[Any, float, int], list[dict[str, Any]]]
"""``runner(job, rate_bytes_per_s, repeats) -> [records of each repeat]``."""


def netns_runner(prefix: str | None = None) -> RealRunner:
    """Runs a job ``repeats`` times on one emulated cluster shaped to the rate."""

    def run(job: Any, rate: float, repeats: int) -> list[dict[str, Any]]:
        import tempfile

        from realrun.launch import Placement, launch
        from realrun.netns import EmulatedCluster, terminate_as_interrupt

        pre = prefix or os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
        out: list[dict[str, Any]] = []
        with (
            tempfile.TemporaryDirectory(prefix=temp_prefix("validate")) as tmp,
            terminate_as_interrupt(),
            EmulatedCluster(job.hosts, rate, prefix=pre) as emu,
        ):
            placement = Placement(emu.command, emu.hosts[0].address, lambda h: emu.hosts[h].ifname)
            for i in range(repeats):
                out.append(launch(job, os.path.join(tmp, f"run{i}"), placement))
        return out

    return run


def table_path(out_dir: str) -> str:
    """The Parquet table (the store's output; a CSV copy is written beside it)."""
    return os.path.join(out_dir, "validation.parquet")


def records_path(out_dir: str, case: Case, repeat: int) -> str:
    """Where the records of repeat ``repeat`` of ``case``'s real run are kept (gzipped
    JSON under ``real/`` of ``out_dir``): every span each rank recorded, so the measured
    trace can be built again (``bench/resimulate.py --rebuild``)."""
    return os.path.join(out_dir, "real", f"{case.case_id}-r{repeat}.json.gz")


def kept_repeats(out_dir: str, prefix: str = "") -> Iterator[tuple[Any, Case, int, str]]:
    """``(row, case, repeat, records file)`` for every repeat of the cases of the
    validation in ``out_dir`` that ran (status ``ok``) and whose id starts with
    ``prefix``: what the scripts that read kept runs again walk (``bench/``)."""
    import pandas as pd

    table = pd.read_parquet(table_path(out_dir))
    for _, row in table.iterrows():
        if row.status != "ok" or not row.point_id.startswith(prefix):
            continue
        case = case_from_row(row)
        for k in range(int(row.repeats)):
            yield row, case, k, records_path(out_dir, case, k)


def keep_records(records: Mapping[str, Any], path: str) -> None:
    """Write a real run's records to ``path`` (gzipped JSON, atomically)."""
    import gzip

    from traces.atomic import atomic_path

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp, gzip.open(tmp, "wt") as fh:
        json.dump(records, fh)


def load_records(path: str) -> dict[str, Any]:
    """The records :func:`keep_records` wrote."""
    import gzip

    with gzip.open(path, "rt") as fh:
        return json.load(fh)
