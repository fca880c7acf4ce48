"""``sim real``: run a scheme for real with torch.distributed and measure it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

import click

from dtsim.cli.chakra_out import chakra_out_option, check_chakra_out
from dtsim.cli.clean import clean_stale
from dtsim.cli.errors import BadInput
from dtsim.cli.options import run_options, spec_from_params
from dtsim.cli.output import check_output, check_output_dir, output_folder, table, write_json
from realrun.job import DEFAULT_REAL_BATCH, Job
from realrun.owner import temp_dir
from realrun.spec import RealSpec
from simcore.units import format_bytes, format_rate, format_time


def run_options_real(f: Any) -> Any:
    """``sim run``'s options plus the real-run settings of :class:`RealSpec`."""
    return run_options(f, RealSpec)


@click.command("real")
@run_options_real
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option(
    "--trace-out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write the measured timeline as a Chrome trace (same layout as sim run's).",
)
@chakra_out_option
@click.option(
    "--profile-out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Also profile the model's layers on this machine (rank 0, before training) "
    "and write the layer trace (dtsim JSON) for sim run --model FILE.",
)
@click.option(
    "--keep",
    "keep_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Keep the job file, rank logs and raw records in DIR.",
)
@click.option(
    "--write-job",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Only write the job file for torchrun (python -m realrun --job FILE).",
)
@click.option(
    "--calibration",
    default="netns",
    show_default=True,
    metavar="FILE",
    help="Topology the prediction printed beside a --device emulated run is made with: "
    "a 'sim calibrate' file (moved to the run's link rate) or a preset; netns is "
    "uncalibrated. An emulated pipeline runs the stages of that prediction.",
)
@click.option(
    "--from-records",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    metavar="FILE",
    help="Summarise the records.json of a run made with torchrun.",
)
@click.pass_context
def real(
    ctx: click.Context,
    as_json: bool,
    trace_out: str | None,
    chakra_out: str | None,
    profile_out: str | None,
    keep_dir: str | None,
    write_job: str | None,
    calibration: str,
    from_records: str | None,
    **params: Any,
) -> None:
    """Run a training scheme for real (one process per rank) and print what was measured.

    Takes the same settings as 'sim run' (--gpus is the number of data-parallel workers;
    ps and p3 add their server ranks). Models come from the zoo ('sim profile --help'):
    mlp_small and cnn_small take seconds, resnet18 minutes on a CPU; or give your own
    with --model FILE.py:NAME (a function returning an nn.Module, with --input-shape, or
    a pair (module, example_input)). The batch size defaults to 8 per worker.
    --device emulated runs a layer trace (sim models) on emulated GPU hosts instead, at the
    trace's batch size, and prints sim run's prediction beside the measurement.

    \b
    Examples:
      sim real --gpus 2 --scheme dp --model mlp_small
      sim real --gpus 3 --scheme p3 --model resnet18 --cluster netns --bandwidth 1Gbps
      sim real --gpus 4 --scheme gossip --model cnn_small --trace-out real.json
      sim real --gpus 2 --scheme dp --model mynet.py:make_net --input-shape 3,32,32
      sim real --device emulated --model resnet50 --gpus 16 --scheme dp \\
               --cluster netns --bandwidth 10Gbps --dilation 10
    """
    for option, path in (
        ("--trace-out", trace_out),
        ("--profile-out", profile_out),
        ("--write-job", write_job),
    ):
        if path:
            check_output(option, path)
    if keep_dir:
        check_output_dir("--keep", keep_dir)
    check_chakra_out(chakra_out)
    if from_records:
        with open(from_records, encoding="utf-8") as fh:
            records = json.load(fh)
        _report(
            records,
            0.0,
            records.get("cluster", "torchrun"),
            {},
            as_json,
            trace_out,
            profile_out,
            chakra_out=chakra_out,
        )
        return
    spec = spec_from_params(ctx, params, RealSpec)
    from analysis.resolve import load_preset

    load_preset(spec.topology)  # as sim run does: a name or file that is no preset is refused
    if spec.device == "emulated":
        from simcore.config import ConfigError

        try:
            load_preset(calibration)
        except ConfigError as exc:
            raise BadInput(exc.describe("--calibration")) from None
    if not write_job:
        from realrun.spec import default_workers

        # at once, before torch
        check_ranks(None, spec.gpus or default_workers(), emulated=spec.device == "emulated")
    job = make_job(spec, profile=profile_out is not None, calibration=calibration)
    if write_job:
        from traces.atomic import write_text

        write_text(write_job, json.dumps(job.to_dict(), indent=1) + "\n")
        click.echo(
            f"wrote {write_job}: {job.world_size} ranks; run on each node:\n"
            f"  torchrun --nnodes N --nproc-per-node M --rdzv-endpoint HOST:PORT "
            f"-m realrun --job {write_job} --out results/",
            err=True,
        )
        return
    check_ranks(job)
    cluster = spec.cluster
    from realrun.netns import MAX_HOSTS

    if cluster == "netns" and job.hosts > MAX_HOSTS:
        raise BadInput(
            f"--gpus: {job.workers:,} workers need {job.hosts} hosts; an emulated cluster "
            f"has at most {MAX_HOSTS} (one /24 subnet); use fewer --gpus"
        )
    rate = spec.bandwidth if cluster == "netns" else None
    emulated = _emulation(job)
    if rate and emulated is not None:
        rate = rate / emulated.rate_divisor
    if spec.bandwidth and cluster != "netns":
        click.echo(
            "note: --bandwidth shapes the links of --cluster netns; a local run is unshaped",
            err=True,
        )
    clean_stale()
    out_dir = keep_dir or temp_dir("real")
    try:
        # --keep: the logs of a failed run stay (that is what it is for)
        with output_folder(
            "--keep" if keep_dir else "the run's temporary folder", out_dir, keep_partial=True
        ):
            records, wall, counters = _execute(job, cluster, rate, out_dir)
    finally:
        if not keep_dir:
            shutil.rmtree(out_dir, ignore_errors=True)
    extra: dict[str, Any] = {}
    if emulated is not None:
        extra = _emulated_prediction(job, spec, calibration)
    _report(
        records, wall, cluster, counters, as_json, trace_out, profile_out, rate, chakra_out, extra
    )


def _emulated_prediction(job: Job, spec: Any, calibration: str) -> dict[str, Any]:
    """What ``sim run`` predicts for an emulated run (:func:`analysis.emulated.predict`),
    as result columns."""
    p = _predict_emulated(
        spec,
        job.model,
        job.workers,
        calibration,
        iterations=job.iterations,
        warmup_iterations=job.warmup_iterations,
    )
    return {
        "predicted_iteration_time_s": p.iteration_time_s,
        "predicted_run_iteration_time_s": p.run_iteration_time_s,
        "prediction_calibration": calibration,
        "predicted_comm_bytes_per_iteration": p.result.comm_bytes_per_iteration,
        "predicted_seed_iteration_times_s": list(p.seed_times_s),
        **{
            f"predicted_{key}": p.result.extra[key]
            for key in ("activation_peak_bytes", "stash_peak_bytes")
            if key in p.result.extra
        },
    }


def check_ranks(job: Job | None, workers: int = 0, emulated: bool = False) -> None:
    """Refuse (exit 2) a run whose ranks this machine cannot hold (see
    :mod:`realrun.guard`), saying how many would fit: ``job``'s ranks with its model, or,
    before the job is made (no torch yet), ``workers`` ranks without a model (on
    ``emulated`` devices: more ranks per core)."""
    from realrun.guard import (
        EMULATED_RANKS_PER_CORE,
        RANKS_PER_CORE,
        ModelFootprint,
        available_memory,
        machine_cores,
        model_footprint,
        rank_refusal,
    )

    per_core = RANKS_PER_CORE
    if job is None:
        ranks, footprint, servers = workers, ModelFootprint(0, 0), ""
        if emulated:
            per_core = EMULATED_RANKS_PER_CORE
    else:
        ranks = job.world_size
        footprint = model_footprint(job.model, job.input_shape, job.batch_size)
        workers, servers = job.workers, f" and {job.servers} servers" if job.servers else ""
        if _emulation(job) is not None:
            per_core = EMULATED_RANKS_PER_CORE
    why = rank_refusal(ranks, footprint, available_memory(), machine_cores(), per_core)
    if why is not None:
        raise BadInput(f"--gpus: {workers:,} workers{servers}: {why}; use fewer --gpus")


def make_job(spec: Any, *, profile: bool = False, calibration: str | None = None) -> Job:
    """The :class:`Job` for a run spec (:func:`realrun.job.job_from_spec`; ``BadInput``
    naming what cannot run for real). An emulated pipeline runs the stages of the
    prediction made with ``calibration`` (the calibrated hosts at the run's rate), so the
    run and its prediction split alike."""
    from analysis.resolve import zoo_config
    from dtsim.cli.errors import flag_name
    from realrun import zoo
    from realrun.job import JobError, job_from_spec
    from realrun.spec import DEFAULT_REAL_MODEL, default_workers
    from realrun.usermodel import resolve_model
    from simcore.config import ConfigError

    workers = spec.gpus or default_workers()
    if spec.device == "emulated":
        model = emulated_ref(spec, workers)
    else:
        for name, value, default in (
            ("--dilation", spec.dilation, 1.0),
            ("--byte-scale", spec.byte_scale, None),
        ):
            if value != default:
                raise BadInput(f"{name}: applies to --device emulated only (here {spec.device})")
        model = spec.model or DEFAULT_REAL_MODEL
    if spec.device != "emulated" and not zoo.is_zoo(model) and not zoo.looks_like_reference(model):
        raise BadInput(
            f"--model: {model!r} is not a zoo model (a real run needs the model "
            f"itself, not a trace); choose one of: {', '.join(zoo.names())}, or give "
            "FILE.py:NAME or package.module:NAME"
        )
    resolved = resolve_model(model, spec.input_shape)  # ConfigError: one line
    model, input_shape = resolved.ref, resolved.input_shape
    backend = spec.backend
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    batch_size = spec.batch_size or DEFAULT_REAL_BATCH
    options = spec.scheme_options
    if spec.device == "emulated":
        from analysis.emulated import scaled_options
        from traces.emulated import parse_ref

        batch_size = parse_ref(model).batch_size
        options = scaled_options(spec.scheme, options, parse_ref(model).byte_scale)

    def plan_config(opts: dict[str, Any]) -> Any:
        """The simulated configuration a pipeline's stages follow: the prediction's for an
        emulated run, else ``sim run``'s of the zoo model."""
        if spec.device == "emulated" and calibration:
            return _predict_emulated(spec, model, workers, calibration).config
        return zoo_config(
            model, batch_size, workers, spec.scheme, opts, spec.optimizer, input_shape=input_shape
        )

    try:
        job = job_from_spec(
            spec.scheme,
            workers,
            options,
            plan_config=plan_config,
            model=model,
            input_shape=input_shape,
            batch_size=batch_size,
            iterations=spec.iterations,
            warmup_iterations=spec.warmup_iterations,
            seed=spec.seed,
            optimizer=spec.optimizer,
            lr=spec.lr,
            backend=backend,
            timeout_s=spec.timeout_s,
            profile=profile,
            fault=os.environ.get("DTSIM_REAL_FAULT", ""),
        )
    except JobError as exc:
        context = click.get_current_context(silent=True)
        raise BadInput(exc.describe(flag_name(exc.field, context and context.command))) from None
    except ConfigError as exc:
        raise BadInput(str(exc)) from None
    except ValueError as exc:
        raise BadInput(f"--batch-size: {exc}") from None
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < workers:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise BadInput(
                f"--backend: nccl needs one CUDA device per rank: {workers} "
                f"asked, {have} present (use --backend gloo)"
            )
    return job


def _emulation(job: Job) -> Any:
    """The :class:`traces.emulated.EmulatedSpec` of ``job``'s model, or ``None`` when it
    computes for real."""
    from traces.emulated import is_emulated_ref, parse_ref

    return parse_ref(job.model) if is_emulated_ref(job.model) else None


def emulated_ref(spec: Any, workers: int) -> str:
    """The emulated model of ``spec`` (``--device emulated``): :func:`analysis.emulated.
    model_ref` of ``--model`` (resnet50 when none), ``--batch-size``, ``--dilation`` and
    ``--byte-scale``; ``BadInput`` naming the option that is wrong."""
    from analysis.emulated import model_ref
    from realrun.job import server_ranks
    from simcore.config import ConfigError
    from traces.catalog import default_model

    if spec.input_shape:
        raise BadInput(
            "--input-shape: an emulated model's inputs come from its trace; leave it out"
        )
    servers = server_ranks(spec.scheme, spec.scheme_options, workers)
    rate = spec.bandwidth if spec.cluster == "netns" else None
    try:
        return model_ref(
            spec.model or default_model(),
            batch_size=spec.batch_size,
            dilation=spec.dilation,
            byte_scale=spec.byte_scale,
            ranks=workers + servers,
            hosts=workers,
            cluster_rate_bytes_per_s=rate,
        )
    except ConfigError as exc:
        raise BadInput(exc.describe(f"--{exc.field.replace('_', '-')}")) from None


def _predict_emulated(spec: Any, model: str, workers: int, calibration: str, **kw: Any) -> Any:
    """:func:`analysis.emulated.predict` of ``spec``'s scheme on ``workers`` devices
    running the emulated ``model``, with the cluster's scheme options (predict scales
    them as the job's were) and link rate; ``kw``: its keyword arguments."""
    from analysis.emulated import predict

    cluster_rate = spec.bandwidth if spec.cluster == "netns" else None
    return predict(
        model, spec.scheme, workers, spec.scheme_options, calibration, cluster_rate,
        optimizer=spec.optimizer, **kw,
    )  # fmt: skip


def _execute(
    job: Job, cluster: str, rate: float | None, out_dir: str
) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """Launch ``job`` locally or on an emulated cluster; ``(records, wall_s, counters)``."""
    from realrun.launch import launch

    bar = _Bar(job)
    if cluster == "netns":
        bar.describe(f"building {job.hosts} emulated hosts")
    t0 = time.perf_counter()
    counters: dict[str, Any] = {}
    try:
        if cluster == "netns":
            from realrun.launch import Placement
            from realrun.netns import EmulatedCluster, check_available, terminate_as_interrupt

            check_available()
            prefix = os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
            with terminate_as_interrupt(), EmulatedCluster(job.hosts, rate, prefix=prefix) as emu:
                placement = Placement(
                    emu.command, emu.hosts[0].address, lambda h: emu.hosts[h].ifname
                )
                before = emu.interface_bytes()
                records = launch(job, out_dir, placement, progress=bar, on_start=bar.starting)
                after = emu.interface_bytes()
                counters = _wire_counters(before, after, rate)
        else:
            records = launch(job, out_dir, progress=bar, on_start=bar.starting)
    finally:
        bar.close()
    return records, time.perf_counter() - t0, counters


class _Bar:
    """A tqdm bar on a terminal: the cluster's build and the ranks' start, then the
    iterations of the slowest worker."""

    def __init__(self, job: Job) -> None:
        from tqdm import tqdm

        self.desc = f"{job.scheme} x{job.world_size} ranks"
        self.starting_up = True
        self.bar = tqdm(
            total=job.total_iterations,
            desc=self.desc,
            unit="it",
            leave=False,
            disable=not sys.stderr.isatty(),
        )

    def describe(self, what: str) -> None:
        """Show what happens before the iterations start."""
        self.bar.set_description(f"{self.desc}: {what}")

    def starting(self, started: int, ranks: int) -> None:
        """Rank ``started`` of ``ranks`` has started."""
        self.describe(f"started {started}/{ranks}" if started < ranks else "meeting")

    def __call__(self, iteration: int) -> None:
        if self.starting_up:
            self.starting_up = False
            self.bar.set_description(self.desc, refresh=False)
        self.bar.n = max(0, min(iteration, self.bar.total))
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _wire_counters(
    before: list[dict[str, Any]], after: list[dict[str, Any]], rate: float | None
) -> dict[str, Any]:
    """Bytes each host's veth sent and received during the run (the kernel's counters:
    payload plus TCP/IP headers, start-up and rendezvous included)."""
    hosts = []
    for b, a in zip(before, after, strict=True):
        hosts.append(
            {
                "host": a["index"],
                "tx_bytes": a["tx_bytes"] - b["tx_bytes"],
                "rx_bytes": a["rx_bytes"] - b["rx_bytes"],
            }
        )
    return {
        "wire_bytes_by_host": hosts,
        "wire_bytes_total": sum(h["tx_bytes"] for h in hosts),
        "link_rate_bytes_per_s": rate,
    }


def _report(
    records: dict[str, Any],
    wall: float,
    cluster: str,
    counters: dict[str, Any],
    as_json: bool,
    trace_out: str | None,
    profile_out: str | None,
    rate: float | None = None,
    chakra_out: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    from realrun.metrics import spans, summarize

    result = summarize(records, wall_s=wall, cluster=cluster, link_counters=counters)
    if extra:
        result.update(extra)
        if "emulated_iteration_time_s" in result:
            measured = result["emulated_iteration_time_s"]
            result["prediction_rel_err"] = (
                result["predicted_iteration_time_s"] - measured
            ) / measured
    if trace_out:
        from simcore.chrome import to_chrome_trace

        meta = {"dtsim": {k: v for k, v in result.items() if not isinstance(v, dict | list)}}
        write_json(trace_out, to_chrome_trace(spans(records), result["device_names"], meta))
    if chakra_out:
        _write_chakra(records, result, chakra_out, as_json)
    if profile_out:
        profile = records.get("profile")
        if profile is None:
            raise BadInput(
                "--profile-out: the records hold no profile (the run was made "
                "without --profile-out)"
            )
        write_json(profile_out, profile)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(real_table(result, rate))
    if trace_out:
        click.echo(f"  chrome trace       {trace_out}  (open in https://ui.perfetto.dev)")
    if profile_out:
        click.echo(f"  layer trace        {profile_out}  (sim run --model {profile_out})")


def _write_chakra(
    records: dict[str, Any], result: dict[str, Any], directory: str, as_json: bool
) -> None:
    """The measured run as Chakra ETs (``--chakra-out``): the spans as measured, the
    layers' sizes from the model's graph (counted on the meta device, nothing runs)."""
    from analysis.chakra_export import RunInfo
    from dtsim.cli.chakra_out import write_chakra_out
    from realrun.metrics import spans
    from realrun.profiler import ProfileConfig, ProfileError, profile_model

    job = records["job"]
    shape = job.get("input_shape")
    try:
        sizes = profile_model(
            job["model"],
            ProfileConfig(
                batch_size=int(job["batch_size"]),
                dtype=job.get("dtype", "float32"),
                analytic=True,
                device_flops=1e12,
                progress=False,
            ),
            tuple(shape) if shape else None,
        )
    except (ProfileError, ValueError):
        sizes = None  # layer passes then carry their names only
    info = RunInfo(
        model=str(job["model"]),
        batch_size=int(job["batch_size"]),
        device=result.get("device_model") or result.get("device_type", "cpu"),
        scheme=str(job["scheme"]),
        warmup_iterations=int(job["warmup_iterations"]),
        iterations=int(job["iterations"]),
        iteration_time_s=float(result["iteration_time_s"]),
        source=f"measured by sim real ({result['topology']}, {records.get('torch', '')})",
        framework=f"PyTorch {records.get('torch', '')} (measured)".replace("  ", " "),
        dtype=sizes.meta.dtype if sizes is not None else "float32",
        microbatches=int(result.get("microbatches", 1) or 1),
    )
    write_chakra_out(
        directory,
        spans(records),
        result["device_names"],
        info,
        sizes,
        lambda line: click.echo(line, err=as_json),
    )


def real_table(r: dict[str, Any], rate: float | None = None) -> str:
    """The summary of a measured run, laid out like ``sim run``'s."""
    util = r["per_gpu_utilization"] or [0.0]
    kinds = ", ".join(
        f"{k} {format_bytes(v / (r['iterations'] + r['warmup_iterations']))}"
        for k, v in sorted(r["comm_bytes_by_link_kind"].items())
    )
    where = r["cluster"] + (f" at {format_rate(rate)}" if rate else "")
    servers = f" + {r['servers']} servers" if r["servers"] else ""
    head = (
        f"{r['scheme']} | {r['model']} | {r['gpus']} rank{'s' if r['gpus'] != 1 else ''}"
        f"{servers} ({r['device_model']}, {r['backend']}) | {where} | measured"
    )
    rows = [
        (
            "iteration time",
            f"{format_time(r['iteration_time_s'])}  (mean of {r['iterations']} "
            f"after {r['warmup_iterations']} warm-up)",
        ),
        (
            "throughput",
            f"{r['throughput_samples_s']:,.1f} samples/s  (batch {r['batch_size']} "
            f"per replica, {r['global_batch_size']} global)",
        ),
        (
            "speedup",
            f"{r['speedup']:.2f}x  over 1 rank at the same global batch, from the "
            f"measured compute ({format_time(r['single_gpu_time_s'])})",
        ),
        (
            "utilisation",
            f"{100 * r['gpu_utilization']:.1f}%  (min {100 * min(util):.1f}%, "
            f"max {100 * max(util):.1f}%)",
        ),
        ("bubble / idle", f"{100 * r['bubble_fraction']:.1f}%"),
        (
            "communication",
            f"{format_bytes(r['comm_bytes_per_iteration'])} sent per iteration"
            + (f"; on links: {kinds}" if kinds else ""),
        ),
        (
            "peak memory",
            f"{format_bytes(r['peak_memory_bytes'])} per rank "
            f"({'CUDA allocations' if r['device_type'] == 'cuda' else 'resident'})",
        ),
        ("run", f"{r['events']:,} spans in {format_time(r['wall_s'])} (start-up included)"),
    ]
    if "stash_peak_bytes" in r:
        rows.insert(
            -1,
            (
                "pipeline",
                f"{len(r['stage_replicas'])} stages "
                f"(replicas {r['stage_replicas']}), "
                f"{r['microbatches']} micro-batches per iteration",
            ),
        )
        rows.insert(
            -1,
            (
                "stash / activations",
                "peak per rank: "
                + ", ".join(
                    f"{format_bytes(a)} / {format_bytes(b)}"
                    for a, b in zip(r["stash_peak_bytes"], r["activation_peak_bytes"])
                )
                + _predicted_memory(r),
            ),
        )
    if "emulated_iteration_time_s" in r:
        rows[-1:-1] = emulated_rows(r)
    if "wire_bytes_total" in r:
        rows.append(
            (
                "on the wire",
                f"{format_bytes(r['wire_bytes_total'])} sent by the hosts' "
                "veths (kernel counters, whole run)",
            )
        )
    return head + "\n" + table(rows)


def _predicted_memory(r: dict[str, Any]) -> str:
    """What ``sim run`` predicted for an emulated pipeline's stash and activation peaks,
    beside the measured ones (empty without a prediction)."""
    keys = ("stash_peak_bytes", "activation_peak_bytes")
    if not all(f"predicted_{k}" in r for k in keys):
        return ""
    if all(r[k] == r[f"predicted_{k}"] for k in keys):
        return " (sim run's, to the byte)"
    pred = zip(r["predicted_stash_peak_bytes"], r["predicted_activation_peak_bytes"])
    return "; sim run: " + ", ".join(f"{format_bytes(a)} / {format_bytes(b)}" for a, b in pred)


def emulated_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows a run on emulated devices adds: the emulated cluster's iteration time and
    throughput (the run's divided by the dilation), the prediction beside it, and the
    machine's CPU use with its flag."""
    k, b = r["dilation"], r["byte_scale"]
    rows = [
        (
            "emulated cluster",
            f"{format_time(r['emulated_iteration_time_s'])} per iteration, "
            f"{r['emulated_throughput_samples_s']:,.1f} samples/s  (the run's / {k:g}: "
            f"compute x{k:g}, bytes /{b:g}, links / {k * b:g})",
        )
    ]
    if "predicted_iteration_time_s" in r:
        rows.append(
            (
                "predicted",
                f"{format_time(r['predicted_iteration_time_s'])} per iteration by sim run "
                f"({100 * r['prediction_rel_err']:+.1f}%; --calibration "
                f"{r['prediction_calibration']})" + _seed_range(r),
            )
        )
    busy = r.get("machine_cpu_busy_share")
    if busy is not None:
        from realrun.metrics import CPU_FLAG_SHARE

        flag = (
            f"FLAGGED: above {100 * CPU_FLAG_SHARE:.0f}%, ranks may have waited for a core"
            if r.get("cpu_flagged")
            else f"headroom left; flagged above {100 * CPU_FLAG_SHARE:.0f}%"
        )
        rows.append(("machine CPU", f"{100 * busy:.0f}% busy while measured ({flag})"))
    return rows


def _seed_range(r: dict[str, Any]) -> str:
    """The range of a prediction over the seeds that drew its links' rates ('' if one)."""
    times = r.get("predicted_seed_iteration_times_s") or []
    if len(times) < 2:
        return ""
    return f"; {format_time(min(times))} to {format_time(max(times))} over {len(times)} seeds"
