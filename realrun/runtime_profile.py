"""A model's profile taken inside the data-parallel runtime, at two batch sizes.

One profile per model serves every prediction made of it: every scheme, rank count,
link rate, stage cut and micro-batch. It is what ``sim profile --in-runtime`` writes and
what ``sim validate`` predicts from, so the user's flow and the validation's are one.

:func:`profile_in_runtime` runs the model's training step in the real data-parallel
runtime on loopback (``launch``), on one rank or on as many as will share the machine's
cores in the runs to predict (ranks sharing cores compute slower), ``repeats`` times at
each batch size, and turns each run into a trace with :func:`realrun.metrics.trace_from_run`:
a layer's time is what its rank's main thread spent from the end of the span before it to
its own end, so the runtime's work around the layers (hooks, Python, the autograd engine)
is part of them, which a layer timed alone (:func:`realrun.profiler.profile_model`) leaves
out. Each layer's time at a batch is the median over the repeats; the batches' times are
fitted as a fixed part plus a part per sample (:func:`traces.batchfit.fit_batch_model`),
so other batches and micro-batches are predicted from this one trace. The optimizer
step's cost (:class:`realrun.metrics.UpdateCost`) is measured in the same runs, at the
largest batch (the step does not depend on it).
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from realrun.allocator import keep_freed_memory
from realrun.metrics import UpdateCost, median_trace, trace_from_run, update_cost
from traces.model import Trace

ITERATIONS, WARMUP = 12, 2
"""Measured and warm-up iterations of each profiling run (means over the measured ones)."""

REPEATS = 3
"""Profiling runs per batch size; a layer's time is their median (one run on this shared
machine has been 25% off the next)."""

OPTIMIZER = "momentum"
"""The optimizer whose step is measured (the simulator's default)."""

PROBE_CALLS, PROBE_WARMUP = 15, 3
"""Timed and untimed calls of :func:`compute_probe_s`."""

Launcher = Callable[[Any, str], dict[str, Any]]
"""``launcher(job, out_dir) -> records``: :func:`realrun.launch.launch` or a stand-in."""


def default_batches(batch_size: int) -> tuple[int, ...]:
    """The batch sizes a profile for ``batch_size`` is taken at: a quarter of it and
    itself (``(batch_size,)`` when a quarter is under one sample)."""
    small = batch_size // 4
    return (small, batch_size) if small >= 1 and small < batch_size else (batch_size,)


@dataclass(frozen=True)
class RuntimeProfile:
    """A model's profile inside the runtime.

    Attributes:
        trace: the layer trace at the largest batch, with each layer's fixed part fitted
            over all the batches (when there were two or more).
        update: the optimizer step's cost (``gpu.memory_bandwidth_bytes_per_s`` and
            ``gpu.step_overhead_s`` of a preset).
        batches: the batch sizes it was measured at.
        runs: profiling runs per batch.
    """

    trace: Trace
    update: UpdateCost
    batches: tuple[int, ...]
    runs: int

    def update_mapping(self) -> dict[str, float]:
        """The step's cost by its preset names."""
        return {
            "memory_bandwidth_bytes_per_s": self.update.bytes_per_s,
            "step_overhead_s": self.update.overhead_s,
        }


def profile_in_runtime(
    model: str,
    batches: Sequence[int],
    *,
    input_shape: tuple[int, ...] | None = None,
    structure: Trace | None = None,
    repeats: int = REPEATS,
    ranks: int = 1,
    iterations: int = ITERATIONS,
    warmup: int = WARMUP,
    launcher: Launcher | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RuntimeProfile:
    """Profile ``model`` (a zoo name or ``FILE.py:NAME``) inside the data-parallel runtime
    on one rank at each of ``batches`` (see the module docs). ``structure``: the model's
    layers, parameters and graph at any batch (:func:`realrun.profiler.profile_model` at
    the largest batch when not given; only its structure and its times' ratios between
    layers the runtime does not record are used). ``ranks``: data-parallel ranks, each
    computing ``batches`` samples (more than one: the layers' times are those of a
    machine whose cores the ranks share, the means over the ranks).
    ``progress(done, total)`` after each run. ``ValueError`` for no batch, a batch below
    one, repeats or ranks below one."""
    sizes = sorted(set(int(b) for b in batches))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be one or more positive numbers, got {batches}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if structure is None:
        from realrun.profiler import ProfileConfig, profile_model

        structure = profile_model(
            model, ProfileConfig(batch_size=sizes[-1], progress=False), input_shape
        )
    if launcher is None:
        from realrun.launch import launch as launcher
    from realrun.job import job_from_spec
    from realrun.owner import temp_prefix
    from simcore.config import OPTIMIZERS

    passes = OPTIMIZERS[OPTIMIZER][1]
    total, done = len(sizes) * repeats, 0
    traces: list[Trace] = []
    costs: list[UpdateCost] = []
    for size in sizes:
        base = structure.rescale_batch(size)
        job = job_from_spec(
            "dp",
            ranks,
            {},
            model=model,
            input_shape=input_shape,
            batch_size=size,
            iterations=iterations,
            warmup_iterations=warmup,
            seed=0,
            optimizer=OPTIMIZER,
            backend="gloo",
            timeout_s=max(60.0, 10.0 * structure.compute_s * (iterations + warmup)),
        )
        runs = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory(prefix=temp_prefix("profile")) as tmp:
                runs.append(launcher(job, tmp))
            done += 1
            if progress:
                progress(done, total)
        traces.append(median_trace([trace_from_run(records, base) for records in runs]))
        if size == sizes[-1]:
            costs = [update_cost(records, base, passes) for records in runs]
    trace = traces[-1]
    if len(traces) > 1:
        from traces.batchfit import fit_batch_model

        trace = fit_batch_model(traces)
    update = UpdateCost(
        statistics.median(c.bytes_per_s for c in costs),
        statistics.median(c.overhead_s for c in costs),
    )
    sizes_text = ", ".join(str(b) for b in sizes)
    meta = replace(
        trace.meta,
        provenance=f"measured inside the data-parallel runtime on "
        f"{'one rank' if ranks == 1 else f'{ranks} ranks'} by dtsim "
        f"(realrun.runtime_profile; batches {sizes_text}, median of {repeats} runs each)"
        + ("; fixed parts fitted over the batches" if len(sizes) > 1 else ""),
        step_bytes_per_s=update.bytes_per_s,
        step_overhead_s=update.overhead_s,
    )
    return RuntimeProfile(Trace(meta, trace.layers, trace.edges), update, tuple(sizes), repeats)


def compute_probe_s(calls: int = PROBE_CALLS) -> float:
    """Median wall seconds of one fixed step of single-thread torch compute on this
    machine: a 3x3 convolution's forward and backward over 24 samples of 16 channels of
    32x32 (about 0.1 GFLOP), after :data:`PROBE_WARMUP` untimed ones. ``sim validate``
    reads it when it profiles a model and again before each case's runs, so a case run
    while the machine computes at another speed than at its profile shows as such
    (docs/prediction.md). It runs with freed memory kept
    (:func:`realrun.allocator.keep_freed_memory`, for this process from then on): with
    glibc's defaults each call faults its buffers in again, and on a virtual machine
    those faults, not the compute, set the time. The caller's torch thread count is
    restored."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    keep_freed_memory()
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(24, 16, 32, 32, generator=gen)
        w = torch.randn(16, 16, 3, 3, generator=gen, requires_grad=True)
        times = []
        for i in range(calls + PROBE_WARMUP):
            t0 = time.perf_counter()
            torch.nn.functional.conv2d(x, w, padding=1).sum().backward()
            w.grad = None
            if i >= PROBE_WARMUP:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)
