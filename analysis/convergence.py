"""Convergence under staleness and time to accuracy.

:func:`training_job` turns the convergence settings (model, scheme, GPUs, epochs, samples
per update, learning rate, momentum, seed) into the :class:`~realrun.job.Job` that both
the staleness emulator (:func:`realrun.emulate.emulate`) and the multi-process runtime
(``sim train --real``) run; :func:`train` runs a grid of them and gathers per-epoch
curves; :func:`paper_table` and :func:`to_target` summarise them; :func:`time_to_accuracy`
multiplies the updates a scheme needs to reach a target accuracy by ``sim run``'s
iteration time for the same model, scheme and GPUs on a cluster the user names.
"""

from __future__ import annotations

import math
from typing import Any

CONVERGENCE_SCHEMES = (
    "dp",
    "ps",
    "p3",
    "gossip",
    "mp",
    "gpipe",
    "pipedream",
    "vanilla",
    "spectrain",
)
"""Schemes ``sim train`` compares; ``vanilla`` is ``pipedream`` with ``stash=false``."""

DIGITS_MODELS = ("digits_cnn", "digits_mlp", "digits_lstm", "digits_transformer")
"""The zoo's models of the paper's four families sized for the digits data."""

PIPELINES = ("mp", "gpipe", "pipedream", "vanilla", "spectrain")


def scheme_of(name: str) -> tuple[str, dict[str, Any]]:
    """The real scheme and options of a convergence scheme name (``vanilla`` is PipeDream
    without stashing; the asynchronous pipelines are straight: one GPU per stage)."""
    if name not in CONVERGENCE_SCHEMES:
        raise ValueError(
            f"scheme: {name!r} is not allowed; choose from: {', '.join(CONVERGENCE_SCHEMES)}"
        )
    if name == "vanilla":
        return "pipedream", {"straight": True, "stash": False}
    if name == "pipedream":
        return "pipedream", {"straight": True}
    return name, {}


def training_job(
    model: str,
    scheme: str,
    gpus: int = 4,
    epochs: int = 1,
    batch: int = 32,
    lr: float = 0.05,
    momentum: float = 0.9,
    seed: int = 0,
    dataset: str = "digits",
) -> Any:
    """The job of ``epochs`` epochs of convergence scheme ``scheme`` (see
    :data:`CONVERGENCE_SCHEMES`) on ``gpus`` ranks, ``batch`` samples per weight update
    (:mod:`realrun.data`); a pipeline's stages are those ``sim run`` would use
    (:func:`analysis.resolve.pipeline_plan`)."""
    from analysis.resolve import pipeline_plan
    from realrun import data
    from realrun.job import PIPELINE_SCHEMES, PS_SCHEMES, Job

    real, options = scheme_of(scheme)
    if gpus < 1:
        raise ValueError(f"gpus: {gpus} is not allowed; give 1 or more")
    if real == "gossip" and gpus & (gpus - 1):
        raise ValueError(
            f"gpus: {gpus} is not allowed; gossip pairs workers on a hypercube and needs a "
            "power of two, e.g. 2 or 4"
        )
    pipeline: dict[str, Any] = {}
    if real in PIPELINE_SCHEMES:
        per_rank = batch
        if real in data.ASYNC_PIPELINES:
            options["microbatches"] = gpus
            per_rank = batch * gpus
        elif real == "gpipe":
            m = math.gcd(batch, 4 * gpus)
            options["microbatches"] = m
        pipeline = pipeline_plan(model, per_rank, gpus, real, options)
        if len(pipeline["stage_layers"]) != gpus:
            raise ValueError(
                f"gpus: {gpus} is not allowed for {model}; its layers make only "
                f"{len(pipeline['stage_layers'])} stages"
            )
    else:
        if batch % gpus:
            raise ValueError(
                f"batch: {batch} is not allowed with {gpus} data-parallel workers; give a "
                f"multiple of {gpus}"
            )
        per_rank = batch // gpus
    job = Job(
        scheme=real,
        model=model,
        workers=gpus,
        options=options,
        servers=gpus if real in PS_SCHEMES else 0,
        batch_size=per_rank,
        iterations=1,
        warmup_iterations=0,
        seed=seed,
        optimizer="momentum",
        momentum=momentum,
        lr=lr,
        pipeline=pipeline,
        data=dataset,
    )
    u = data.updates_per_epoch(job)
    k = data.updates_per_iteration(job)
    d = job.to_dict()
    d["iterations"] = -(-epochs * u // k)
    return Job.from_dict(d)
