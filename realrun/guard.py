"""Refusing real runs this machine cannot hold, before any rank starts. No torch at
import (:func:`model_footprint` imports it).

A real run starts one process per rank. Each one costs about :data:`RANK_BASE_BYTES`
of memory before it holds any model (the interpreter, torch and gloo), plus its model's
weights, gradients, optimizer state and communication buffers
(:data:`PARAM_COPIES` copies of the parameters) and its activations
(:data:`ACTIVATION_COPIES` copies: the forward's outputs, kept for the backward, and
their gradients). :func:`rank_refusal` compares that with the memory the machine has
free now (:data:`~simcore.guard.MEMORY_SHARE` of it) and the ranks with its cores
(:data:`RANKS_PER_CORE`), and says how many ranks would fit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from simcore.guard import MEMORY_SHARE, machine_memory
from simcore.units import format_bytes

RANK_BASE_BYTES = 320 << 20
"""Resident memory of a rank before its model: Python, torch and gloo (about 230 MB
after importing torch here, more once gloo's threads and buffers are up)."""
PARAM_COPIES = 4
"""Parameter-sized tensors a rank holds: weights, gradients, the optimizer's state and
the communication buffers (DDP's buckets, a server's aggregates)."""
ACTIVATION_COPIES = 2
"""Activation-sized tensors a rank holds at its peak: the forward's outputs and their
gradients."""
EMULATED_RANKS_PER_CORE = 16
"""Ranks per core for emulated devices, whose compute waits without CPU."""
RANKS_PER_CORE = 8
"""Most ranks per core: beyond that the ranks mostly wait for a core, start-up alone
takes minutes and what is measured says nothing about the scheme."""


@dataclass(frozen=True)
class ModelFootprint:
    """Bytes of a model's parameters and of its activations for one batch."""

    param_bytes: int
    activation_bytes: int


def model_footprint(
    ref: str, input_shape: tuple[int, ...] | None, batch_size: int
) -> ModelFootprint:
    """The footprint of model ``ref`` (see :mod:`realrun.usermodel`) at ``batch_size``,
    from a forward on the meta device (shapes only, nothing allocated): its parameters'
    bytes and the bytes of every leaf module's outputs. Activations count as 0 when the
    model cannot run on the meta device."""
    from traces.emulated import is_emulated_ref, load_run_trace

    if is_emulated_ref(ref):  # outputs are views of one element; joins' gradients are real
        trace = load_run_trace(ref).rescale_batch(batch_size)
        biggest = max(lay.activation_bytes for lay in trace.layers)
        return ModelFootprint(trace.param_bytes, biggest)

    import torch

    from realrun.usermodel import resolve_model

    resolved = resolve_model(ref, input_shape)
    total = [0]

    def hook(_module: object, _inputs: object, output: object) -> None:
        outs = output if isinstance(output, tuple | list) else (output,)
        for t in outs:
            if isinstance(t, torch.Tensor):
                total[0] += t.numel() * t.element_size()

    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = resolved.build()
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        leaves = [m for m in model.modules() if not list(m.children())]
        handles = [m.register_forward_hook(hook) for m in leaves]
        try:
            model(*resolved.example_inputs(batch_size, "meta"))
        except Exception:  # an op the meta device lacks: parameters only
            total[0] = 0
        finally:
            for h in handles:
                h.remove()
    return ModelFootprint(int(params), int(total[0]))


def rank_bytes(footprint: ModelFootprint) -> int:
    """Estimated peak resident memory of one rank training a model of ``footprint``."""
    return (
        RANK_BASE_BYTES
        + PARAM_COPIES * footprint.param_bytes
        + ACTIVATION_COPIES * footprint.activation_bytes
    )


def available_memory() -> int:
    """Bytes of memory free for new processes now (``MemAvailable`` of /proc/meminfo;
    the machine's whole memory where that cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return machine_memory()


def machine_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def ranks_that_fit(
    per_rank_bytes: int, memory_bytes: int, cores: int, per_core: int = RANKS_PER_CORE
) -> int:
    """Most ranks of ``per_rank_bytes`` each that a machine with ``memory_bytes`` free and
    ``cores`` cores runs, at most ``per_core`` per core."""
    by_memory = int(MEMORY_SHARE * memory_bytes // max(1, per_rank_bytes))
    return max(0, min(by_memory, per_core * cores))


def rank_refusal(
    ranks: int,
    footprint: ModelFootprint,
    memory_bytes: int,
    cores: int,
    per_core: int = RANKS_PER_CORE,
) -> str | None:
    """Why ``ranks`` ranks of a model of ``footprint`` cannot run on a machine with
    ``memory_bytes`` free and ``cores`` cores (at most ``per_core`` ranks per core), with
    the estimate and how many would fit; ``None`` when they can."""
    per_rank = rank_bytes(footprint)
    fit = ranks_that_fit(per_rank, memory_bytes, cores, per_core)
    if ranks <= fit:
        return None
    need = ranks * per_rank
    reasons = []
    if need > MEMORY_SHARE * memory_bytes:
        reasons.append(
            f"they need about {format_bytes(need)} of memory ({format_bytes(per_rank)} "
            f"each) and {format_bytes(memory_bytes)} is free"
        )
    if ranks > per_core * cores:
        reasons.append(
            f"{cores} core{'s' if cores != 1 else ''} run at most "
            f"{per_core * cores} ranks ({per_core} per core)"
        )
    return (
        f"{ranks:,} ranks are too many for this machine: {', and '.join(reasons)}; "
        f"at most {fit} rank{'s' if fit != 1 else ''} fit here"
    )


EMULATED_LINK_BUDGET_BYTES_PER_S = 25e6
"""Bytes per second (200 Mbit/s) the shaped links of an emulated cluster may carry
together, summed over its hosts, when ``--byte-scale`` is left to the tool: the kernel's
packet work on the veth pairs and ``tc`` queues costs this machine's CPU nanoseconds per
byte (``sim calibrate``'s link CPU: 0.4 ns at 1 Gbit/s, 12 ns at 100 Mbit/s, per side), and
an emulated GPU host must leave the CPU to the framework. Measured with P3 on 4 emulated
ResNet-18 hosts: 20 MB/s of traffic left 57% of the cores idle, 80 MB/s 9%
(docs/emulated_devices.md)."""


def auto_byte_scale(
    param_bytes: int,
    ranks: int,
    hosts: int,
    link_rate_bytes_per_s: float | None,
    memory_bytes: int,
) -> float:
    """The smallest whole byte scale B for an emulated run whose links (``hosts`` of
    ``link_rate_bytes_per_s`` each after dilation; ``None``: unshaped) carry at most
    :data:`EMULATED_LINK_BUDGET_BYTES_PER_S` together, and whose ``ranks`` ranks hold their
    parameters (``param_bytes`` each, :data:`PARAM_COPIES` copies) in half of
    ``memory_bytes``."""
    b = 1.0
    if link_rate_bytes_per_s:
        b = max(b, hosts * link_rate_bytes_per_s / EMULATED_LINK_BUDGET_BYTES_PER_S)
    model_memory = MEMORY_SHARE * memory_bytes - ranks * RANK_BASE_BYTES
    if model_memory > 0:
        b = max(b, ranks * PARAM_COPIES * param_bytes / (0.5 * model_memory))
    return float(math.ceil(b - 1e-9))
