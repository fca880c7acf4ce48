"""What a simulation will cost, estimated before it runs (pure: no I/O).

:func:`estimate` counts, from the configuration alone (no topology is built, so an absurd
``gpus`` is answered at once), the simulated system's events (compute ops and message
transfers, chunk by chunk in the detailed model) and the messages the run keeps for its
metrics (each scheme counts its own messages,
:meth:`~simcore.schemes.base.Scheme.estimate_work` of a :class:`Workload`), and turns
them into seconds and bytes with per-event and per-message costs measured on a 2-core
machine (``bench/guard_estimate.py`` compares them with real runs).
The estimate is meant to be right within a small factor; a caller (the ``sim``
command) compares it with what the machine can give and refuses runs that could not
finish, saying what to change.

:func:`schedule_actions` does the same for a pipeline schedule laid out as a grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simcore.config import SimConfig
from simcore.work import Workload

SECONDS_PER_OP = 0.4e-6
"""Wall seconds per compute op (a GPU queues runs of ops as one event)."""
SECONDS_PER_MESSAGE = 8e-6
"""Wall seconds per message (its events, callbacks and bookkeeping)."""
SECONDS_PER_CHUNK = 2e-6
"""Wall seconds per further chunk hop of the detailed model."""
SECONDS_PER_GPU = 0.3e-3
"""Wall seconds per GPU to build the cluster and its routes."""
BYTES_PER_MESSAGE = 450
"""Memory per message the network keeps (record, payload, arrival event)."""
BYTES_PER_GPU = 6_000
"""Memory per simulated GPU (device, memory account, per-iteration bookkeeping)."""
BYTES_PER_FOLLOWER = 600
"""Memory per GPU that a mean-field model mirrors instead of simulating."""
BYTES_PER_SPAN = 250
"""Memory per span record kept for a Chrome trace."""
BASE_BYTES = 30 << 20
"""Python, SimPy, numpy and the trace."""


@dataclass(frozen=True)
class WorkEstimate:
    """What a run should cost.

    Attributes:
        events: model events (compute ops and message transfers).
        messages: messages the network records.
        memory_bytes: peak memory of the process.
        seconds: wall seconds of the simulation.
        mean_field: whether a mean-field model was assumed (``ps``/``p3``, analytic).
    """

    events: int
    messages: int
    memory_bytes: int
    seconds: float
    mean_field: bool


def _per_box(config: SimConfig) -> int:
    topo = config.topology
    preset = getattr(topo, "preset", None)
    if preset is None:  # a concrete Topology
        boxes = max(1, getattr(topo, "num_boxes", 1))
        return max(1, topo.num_gpus // boxes)
    try:
        return max(1, int(preset["box"]["gpus"]))
    except (KeyError, TypeError, ValueError):
        return 1


def workload(config: SimConfig) -> Workload:
    """The :class:`Workload` of ``config``."""
    from simcore.schemes import get_scheme

    cls = get_scheme(config.scheme)
    p = int(getattr(config.topology, "gpus", 0) or config.topology.num_gpus)
    layers = [x for x in config.trace.layers if x.kind != "input"]
    g = min(p, _per_box(config))
    return Workload(
        config=config,
        options=config.options if config.options is not None else cls.Options(),
        gpus=p,
        iterations=config.total_iterations,
        layers=max(1, len(layers)),
        param_bytes=tuple(x.param_bytes for x in layers if x.param_bytes > 0),
        activation_bytes=sum(x.activation_bytes for x in layers),
        per_box=g,
        boxes=max(1, math.ceil(p / g)),
    )


def estimate(config: SimConfig) -> WorkEstimate:
    """The :class:`WorkEstimate` of ``config`` (see module docs): the scheme's own
    :meth:`~simcore.schemes.base.Scheme.estimate_work`, in seconds and bytes."""
    from simcore.schemes import get_scheme

    w = workload(config)
    work = get_scheme(config.scheme).estimate_work(w)
    p, its = w.gpus, w.iterations
    chunk = max(1, config.chunk_bytes)
    hops = 3 if w.boxes > 1 else 2
    simulated = p if work.simulated_gpus is None else work.simulated_gpus
    compute = p * 2 * w.layers * its if work.compute_ops is None else work.compute_ops
    messages = work.messages
    transfers = messages
    if w.detailed:
        transfers = max(messages, int(work.moved_bytes * hops / chunk) + messages)
    events = int(compute + transfers)
    followers = p - simulated
    memory = (
        BASE_BYTES
        + simulated * BYTES_PER_GPU
        + followers * BYTES_PER_FOLLOWER
        + messages * BYTES_PER_MESSAGE
        + p * its * 16
    )
    if config.record_spans:
        memory += (2 * messages + compute) * BYTES_PER_SPAN
    seconds = (
        p * SECONDS_PER_GPU
        + compute * SECONDS_PER_OP
        + messages * SECONDS_PER_MESSAGE
        + (transfers - messages) * SECONDS_PER_CHUNK
    )
    return WorkEstimate(
        events=events,
        messages=messages,
        memory_bytes=int(memory),
        seconds=seconds,
        mean_field=work.mean_field,
    )


def schedule_actions(stages: int, microbatches: int, iterations: int) -> int:
    """Actions of a pipeline schedule laid out as a grid: a forward and a backward per
    micro-batch and stage, with their sends and receives."""
    return 4 * stages * microbatches * iterations


def machine_memory() -> int:
    """Bytes of physical memory of this machine (24 GiB if it cannot be told): a system
    call, no file access."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 24 << 30


MEMORY_SHARE = 0.75
"""Share of the machine's memory a run may be estimated to use."""
MAX_SECONDS = 3600.0
"""Longest estimated simulation accepted (an hour)."""


def work_refusal(config: SimConfig, memory_bytes: float) -> str | None:
    """Why ``config`` would not finish on a machine with ``memory_bytes`` of memory (more
    than :data:`MEMORY_SHARE` of it, or more than :data:`MAX_SECONDS` of simulation), with
    the estimate and the settings to change; ``None`` when it would."""
    from simcore.units import format_bytes, format_time

    est = estimate(config)
    too_big = est.memory_bytes > MEMORY_SHARE * memory_bytes
    if not too_big and est.seconds <= MAX_SECONDS:
        return None
    gpus = getattr(config.topology, "gpus", None) or config.topology.num_gpus
    ways = []
    if config.fidelity == "detailed":
        ways.append("the analytic fidelity")
    if config.iterations > 5:
        ways.append(f"fewer iterations (asked {config.iterations})")
    if gpus > 64:
        ways.append(f"fewer GPUs (asked {gpus:,})")
    if config.record_spans:
        ways.append("no Chrome trace")
    if not ways:
        ways.append("a smaller configuration")
    what = (
        f"about {format_bytes(est.memory_bytes)} of memory (this machine has "
        f"{format_bytes(memory_bytes)})"
        if too_big
        else f"about {format_time(est.seconds)} of simulation (at most "
        f"{format_time(MAX_SECONDS)} accepted)"
    )
    return (
        f"this run is too big to finish here: an estimated {est.events:.3g} events and "
        f"{what}; use {', or '.join(ways)}"
    )
