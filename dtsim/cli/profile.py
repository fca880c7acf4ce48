"""``sim profile``: profile a zoo model into a layer trace."""

from __future__ import annotations

import os
import time
from typing import Any

import click

from dtsim.cli.errors import BadInput
from dtsim.cli.options import out_option, setting_option
from dtsim.cli.output import check_output
from realrun.options import DEFAULT_EFFICIENCY, DEVICES, DTYPES
from realrun.spec import RealSpec
from simcore.spec import ordered_fields

REAL_FIELDS = ordered_fields(RealSpec)
"""The settings of a real run: a profile takes its model, input shape and batch size
declared once there, with the same defaults as 'sim real'."""


@click.command("profile")
@setting_option(REAL_FIELDS["model"])
@setting_option(REAL_FIELDS["input_shape"])
@setting_option(REAL_FIELDS["batch_size"])
@click.option(
    "--in-runtime",
    is_flag=True,
    help="Measure inside the data-parallel training runtime (real torch.distributed steps "
    "on loopback, --ranks ranks), as 'sim validate' profiles: each layer's time "
    "includes the runtime's work around it (hooks, autograd, Python), which layers timed "
    "alone leave out, and the optimizer step's cost is measured too and kept in the trace "
    "(a calibrated preset takes it). CPU only.",
)
@click.option(
    "--ranks",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="With --in-runtime: data-parallel ranks, each computing --batch-size samples "
    "(the layers' times are their means). Give as many as will compute on one machine's "
    "cores at once in the runs you predict, at most its cores: the emulated cluster's "
    "ranks all share this machine's cores ('sim validate' profiles on 2), and ranks that "
    "share cores compute slower (docs/prediction.md).",
)
@click.option(
    "--fit-batch",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Also profile at N samples (fewer than --batch-size, e.g. a quarter) and fit each "
    "layer's times as a fixed part plus a part per sample, so other batch sizes and "
    "pipeline micro-batches are predicted from this one trace instead of scaled in "
    "proportion; 0: no fit. [default: 0; a quarter of the batch with --in-runtime]",
)
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    default="cpu",
    show_default=True,
    help="Where to measure (ignored with --analytic).",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default="float32",
    show_default=True,
    help="Element type of parameters and activations.",
)
@out_option("Trace file to write. [default: MODEL-DEVICE-bBATCH.json]")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(("dtsim", "chakra")),
    default="dtsim",
    show_default=True,
    help="dtsim: time every layer alone into a layer trace (JSON). chakra: record one "
    "training step as PyTorch users do for Chakra (ExecutionTraceObserver and Kineto "
    "traces, each layer in a 'layer::' range), linked and converted by chakra's tools "
    "into a Chakra ET (NAME.0.et) that 'sim run --model' reads; needs the chakra extra.",
)
@click.option(
    "--analytic",
    is_flag=True,
    help="Do not measure: count FLOPs on the meta device and turn them into times "
    "(needs --device-flops).",
)
@click.option(
    "--device-flops",
    default=None,
    metavar="RATE",
    help="Peak FLOP/s of the target device for --analytic, e.g. 15.7e12 or 15.7TFLOPS (V100 fp32).",
)
@click.option(
    "--efficiency",
    type=click.FloatRange(0, 1, min_open=True),
    default=DEFAULT_EFFICIENCY,
    show_default=True,
    help="Fraction of --device-flops the layers reach (--analytic).",
)
@click.option(
    "--memory-bandwidth",
    default=None,
    metavar="RATE",
    help="Device memory rate for --analytic, e.g. 900GB/s: a layer is never faster "
    "than moving its bytes. [default: ignore memory traffic]",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Timed samples per layer and direction (the median is kept); with --in-runtime, "
    "training runs per batch size (each layer's median over them). [default: 5; 3 with "
    "--in-runtime]",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Untimed calls before each timing.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, os.cpu_count() or 1),
    default=1,
    show_default=True,
    help="torch intra-op threads.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the inputs.")
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Show a progress bar on stderr.",
)
def profile(
    model: str | None,
    input_shape: str | None,
    batch_size: str | None,
    in_runtime: bool,
    ranks: int,
    fit_batch: int | None,
    device: str,
    dtype: str,
    out: str | None,
    fmt: str,
    analytic: bool,
    device_flops: str | None,
    efficiency: float,
    memory_bandwidth: str | None,
    repeats: int | None,
    warmup: int,
    threads: int,
    seed: int,
    progress: bool,
) -> None:
    """Profile a model of the zoo, or your own, into a layer trace (dtsim JSON).

    The model and batch default to those of 'sim real', so that the trace describes the
    run 'sim real' makes. Every layer of the model's torch.fx graph is timed on its own,
    forward and backward (warm-up, then the median of repeats), with its parameter bytes,
    output activation bytes and FLOPs. With --analytic nothing runs: the graph is built on
    the meta device and times come from FLOPs at --efficiency of --device-flops.

    With --fit-batch N each layer's times are also measured at N samples and split into
    a part that does not grow with the batch and a part per sample, so that 'sim run' at
    another batch size, or a pipeline's micro-batches, pays each call's fixed cost.

    With --in-runtime the times are measured inside real training steps of the
    data-parallel runtime on one rank (at the batch and a quarter of it, fitted as
    above), with the optimizer step's cost: the profile 'sim validate' predicts every
    scheme, rank count and micro-batch from. Use it with a 'sim calibrate' preset of
    this machine ('sim run --model TRACE --topology CALIBRATED.yaml').

    \b
    Examples:
      sim profile --model resnet18 --batch-size 8 --out resnet18.json
      sim run --model resnet18.json --gpus 4 --scheme dp
      sim profile --model mlp_medium --batch-size 24 --in-runtime --out mlp.json
      sim profile --model vgg16 --batch-size 64 --analytic --device-flops 15.7TFLOPS
      sim profile --model mynet.py:make_net --input-shape 3,32,32 --out mynet.json
      sim profile --model resnet18 --batch-size 8 --format chakra --out resnet18.0.et

    A measured trace records where and when it was measured (CPU model, cores, GPU
    model on CUDA, a hardware fingerprint, the date and time); 'sim run' warns when the
    topology claims another device or a measurement more than a day apart.
    """
    from realrun.job import DEFAULT_REAL_BATCH
    from realrun.options import parse_flop_rate
    from realrun.spec import DEFAULT_REAL_MODEL
    from simcore.units import format_bytes, format_time, parse_rate

    if analytic and not device_flops:
        raise BadInput("--analytic needs --device-flops RATE (e.g. 15.7e12 for a V100)")
    if not analytic and (device_flops or memory_bandwidth):
        raise BadInput("--device-flops and --memory-bandwidth only apply with --analytic")
    flops_rate = parse_flop_rate(device_flops) if device_flops else 0.0
    mem_rate = parse_rate(memory_bandwidth) if memory_bandwidth else 0.0
    if fmt == "chakra":
        if analytic:
            raise BadInput("--format chakra records a real step; it cannot be --analytic")
        from traces.chakra import INSTALL_HINT, available

        if not available():
            raise BadInput(f"--format chakra needs the chakra extra: {INSTALL_HINT}")
    given = {"model": model, "input_shape": input_shape, "batch_size": batch_size}
    spec = RealSpec().replace(**{k: v for k, v in given.items() if v is not None})
    batch_size = spec.batch_size or DEFAULT_REAL_BATCH
    if in_runtime and (analytic or fmt == "chakra" or device != "cpu"):
        raise BadInput(
            "--in-runtime measures real training steps on this machine's CPU; drop it with "
            "--analytic, --format chakra or --device cuda"
        )
    if ranks > 1 and not in_runtime:
        raise BadInput(f"--ranks: {ranks} needs --in-runtime (layers timed alone run on one)")
    if fit_batch is None:
        fit_batch = batch_size // 4 if in_runtime and batch_size >= 8 else 0
    if fit_batch and (analytic or fmt == "chakra"):
        raise BadInput(
            "--fit-batch: only a measured dtsim trace has fixed parts to fit; drop it with "
            "--analytic or --format chakra"
        )
    if fit_batch >= batch_size:
        raise BadInput(
            f"--fit-batch: {fit_batch} must be smaller than --batch-size {batch_size} "
            "(or 0 for no fit)"
        )
    resolved = _resolve(spec.model or DEFAULT_REAL_MODEL, spec.input_shape)
    model_name, shape = resolved.ref, resolved.input_shape
    stem = f"{resolved.name}-{'analytic' if analytic else device}-b{batch_size}"
    path = out or (f"{stem}.0.et" if fmt == "chakra" else f"{stem}.json")
    check_output("--out", path)
    if fmt == "chakra":
        _record_chakra(resolved, batch_size, device, dtype, threads, seed, warmup, path)
        return
    from realrun.profiler import ProfileConfig, ProfileError, profile_model
    from traces import save_trace

    started = time.perf_counter()
    if not analytic:
        _check_memory(model_name, batch_size, device, dtype, shape)
    try:
        config = ProfileConfig(
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            warmup=warmup,
            repeats=repeats or 5,
            threads=threads,
            analytic=analytic,
            device_flops=flops_rate,
            efficiency=efficiency,
            memory_bytes_per_s=mem_rate,
            seed=seed,
            progress=progress,
        )
        trace = profile_model(model_name, config, shape)
        if in_runtime:
            trace = _in_runtime(
                model_name, shape, trace, fit_batch, batch_size, repeats or 3, ranks
            )
        elif fit_batch:
            from dataclasses import replace

            from traces.batchfit import fit_batch_model

            small = profile_model(model_name, replace(config, batch_size=fit_batch), shape)
            trace = fit_batch_model([small, trace])
    except ProfileError as exc:
        raise BadInput(str(exc)) from None
    except (MemoryError, RuntimeError) as exc:
        text = " ".join(str(exc).split())
        if not isinstance(exc, MemoryError) and "memory" not in text.lower():
            raise
        raise BadInput(
            f"--batch-size: {batch_size} does not fit in {device} memory while "
            f"profiling {resolved.name} ({text[:160]}); use a smaller batch"
        ) from None
    save_trace(trace, path)
    if in_runtime:
        click.echo(
            f"optimizer step: {format_bytes(trace.meta.step_bytes_per_s)}/s over weight-sized "
            f"passes + {format_time(trace.meta.step_overhead_s)} a step (kept in the trace)"
        )
    click.echo(
        f"wrote {path}: {resolved.name}, {len(trace.layers)} layers, batch {batch_size} on "
        f"{trace.meta.device}; forward {format_time(trace.forward_s)} + backward "
        f"{format_time(trace.backward_s)} per batch; {trace.param_count / 1e6:.2f}M params "
        f"({format_bytes(trace.param_bytes)}); took {time.perf_counter() - started:.1f} s"
    )


def _in_runtime(
    model_name: str,
    shape: tuple[int, ...] | None,
    structure: Any,
    fit_batch: int,
    batch_size: int,
    repeats: int,
    ranks: int = 1,
) -> Any:
    """``--in-runtime``: the profile inside the data-parallel runtime on ``ranks`` ranks
    (:func:`realrun.runtime_profile.profile_in_runtime`) at ``fit_batch`` (where set) and
    ``batch_size``, with a progress bar on a terminal."""
    import sys

    from tqdm import tqdm

    from dtsim.cli.clean import clean_stale
    from realrun.runtime_profile import profile_in_runtime

    clean_stale()
    batches = (fit_batch, batch_size) if fit_batch else (batch_size,)
    bar = tqdm(
        total=len(batches) * repeats,
        desc="profiling in the runtime",
        unit="run",
        leave=False,
        disable=not sys.stderr.isatty(),
    )

    def progress(done: int, total: int) -> None:
        bar.n = done
        bar.refresh()

    try:
        return profile_in_runtime(
            model_name,
            batches,
            input_shape=shape,
            structure=structure,
            repeats=repeats,
            ranks=ranks,
            progress=progress,
        ).trace
    finally:
        bar.close()


def _record_chakra(
    resolved: Any,
    batch_size: int,
    device: str,
    dtype: str,
    threads: int,
    seed: int,
    warmup: int,
    path: str,
) -> None:
    """``--format chakra``: record one training step into the Chakra ET ``path`` and say
    what it holds (read back as ``sim run --model`` reads it)."""
    import torch

    from realrun.kineto import record_chakra
    from simcore.units import format_bytes, format_time
    from traces.chakra import load

    started = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    with torch.device(device):
        model = resolved.build().to(getattr(torch, dtype))
    inputs = resolved.example_inputs(batch_size, device, seed=seed)
    inputs = tuple(
        x.to(getattr(torch, dtype)) if torch.is_tensor(x) and x.is_floating_point() else x
        for x in inputs
    )
    record_chakra(model, inputs, path, warmup=warmup)
    trace = load(path, batch_size=batch_size)
    click.echo(
        f"wrote {path}: {resolved.name}, {len(trace.layers)} layers, batch {batch_size} on "
        f"{device} (Chakra ET of one step); forward {format_time(trace.forward_s)} + backward "
        f"{format_time(trace.backward_s)}; {trace.param_count / 1e6:.2f}M params "
        f"({format_bytes(trace.param_bytes)}); took {time.perf_counter() - started:.1f} s"
    )


def _resolve(model: str, input_shape: str | None) -> Any:
    """The model ``--model`` names (one-line ``BadInput`` naming the flag otherwise)."""
    from realrun.usermodel import resolve_model
    from simcore.settings import ConfigError

    try:
        return resolve_model(model, input_shape)
    except ConfigError as exc:
        raise BadInput(exc.describe("--" + exc.field.replace("_", "-"))) from None


def _check_memory(
    model_name: str,
    batch_size: int,
    device: str,
    dtype: str,
    input_shape: tuple[int, ...] | None = None,
) -> None:
    """Refuse (exit 2) a batch whose inputs, layer outputs and parameters (counted on the
    meta device, where nothing is allocated) would not fit the device's memory: profiling
    keeps every layer's output, its gradient and the parameters' gradients."""
    import torch

    from realrun.profiler import ProfileConfig, ProfileError, profile_model
    from simcore.guard import MEMORY_SHARE, machine_memory
    from simcore.units import format_bytes

    if device == "cuda" and not torch.cuda.is_available():
        return  # the real run says there is no GPU
    try:
        shape = profile_model(
            model_name,
            ProfileConfig(
                batch_size=batch_size, dtype=dtype, analytic=True, device_flops=1e12, progress=False
            ),
            input_shape,
        )
    except ProfileError:
        return  # the real run reports it
    need = 2 * sum(layer.activation_bytes for layer in shape.layers) + 3 * shape.param_bytes
    if device == "cuda":
        have = torch.cuda.get_device_properties(0).total_memory
    else:
        have = int(MEMORY_SHARE * machine_memory())
    if need > have:
        per_sample = max(1, need // batch_size)
        fits = max(1, have // per_sample)
        raise BadInput(
            f"--batch-size: {batch_size} is too big to profile {model_name.rpartition('/')[2]} on "
            f"{device}: its activations and gradients need about "
            f"{format_bytes(need)}, and {format_bytes(have)} can be used; use "
            f"--batch-size {fits} or less, or --analytic"
        )
