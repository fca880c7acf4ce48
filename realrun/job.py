"""What one real run does, as plain data every rank reads: :class:`Job`.

``sim real`` resolves the user's settings (the same ``RunSpec`` as ``sim run``) into a job
(:func:`job_from_spec`, which every maker of a real run calls: the rules of a real run are
the scheme classes' own), writes it as JSON next to the run's outputs and starts one
process per rank, each of which reads it. Under ``torchrun`` the same file is given with
``--job``. No torch here.

Ranks: workers come first (``0 .. workers-1``), then the parameter servers of ``ps`` and
``p3`` (``workers .. workers+servers-1``). Every rank lives on a host: worker ``r`` on host
``r``; a co-located server ``s`` on host ``s`` (as the simulator's ``colocated``
placement puts one server on every machine), a dedicated server on a host of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

BACKENDS = ("gloo", "nccl")
"""torch.distributed backends a real run can use."""

CLUSTERS = ("local", "netns")
"""``local``: every rank on this machine over loopback, unshaped; ``netns``: every host in
its own network namespace, links shaped with ``tc`` (see :mod:`realrun.netns`)."""

DEVICES = ("cpu", "emulated")
"""What a real run computes on (``cuda`` follows from ``--backend nccl``): ``emulated`` is
a model built from a layer trace on an emulated device (:mod:`realrun.emudevice`)."""

DATASETS = ("digits",)
"""Real data sets (:mod:`realrun.data`, which holds the same tuple)."""

DEFAULT_REAL_BATCH = 8
"""Samples per worker per iteration when the user names none: a real model's trace batch
(often 64-256 on a V100) is far too much for a CPU rank."""


class JobError(ValueError):
    """A job that cannot run as asked: ``field`` names the setting, ``text`` says what is
    wrong with it and what is allowed; the message is ``"field: text"``."""

    def __init__(self, field: str, text: str) -> None:
        self.field, self.text = field, text
        super().__init__(f"{field}: {text}")

    def describe(self, shown_name: str) -> str:
        """The message, with the setting shown as ``shown_name`` (e.g. a CLI flag)."""
        return f"{shown_name}: {self.text}"


def real_scheme(name: str) -> Any:
    """The simulator's class of scheme ``name`` (:mod:`simcore.schemes`), which names its
    real runtime; :class:`JobError` listing the schemes that have one if it has none."""
    from simcore.config import ConfigError
    from simcore.schemes import get_scheme, schemes_where

    try:
        cls = get_scheme(name)
    except ConfigError:
        cls = None
    if cls is None or not cls.real_runtime:
        raise JobError(
            "scheme",
            f"{name!r} has no real runtime yet; choose one of: "
            f"{', '.join(schemes_where('real_runtime'))}",
        )
    return cls


@dataclass(frozen=True)
class Job:
    """One real run.

    Attributes:
        scheme: a scheme with a real runtime (its class's ``real_runtime``).
        options: the scheme's options, already validated, as plain values (the fields of
            the simulator's options dataclass for the scheme).
        model: the model reference (:mod:`realrun.usermodel`): a zoo model name, or
            ``/absolute/path/file.py:NAME`` or ``package.module:NAME`` for a user's model.
        input_shape: the per-sample shape of a user model's one input when its callable
            returns only a module (``None`` otherwise).
        workers: data-parallel workers (``--gpus``).
        servers: parameter-server ranks (0 unless the scheme has them).
        dedicated_servers: servers on hosts of their own rather than on the workers'.
        batch_size: samples per worker per iteration.
        iterations: measured iterations.
        warmup_iterations: iterations run first and left out of the metrics.
        seed: seeds the model's initial weights and the data.
        optimizer: ``sgd``, ``momentum`` (SGD with ``momentum``) or ``adam``.
        lr: learning rate.
        backend: ``gloo`` or ``nccl``.
        timeout_s: a rank silent for this long is reported as hung.
        record_layers: record a span per layer (forward) and per gradient-ready layer group
            (backward); off, one span per pass.
        profile: rank 0 profiles the model's layers on this machine before training
            (``--profile-out``).
        save_weights: every worker saves its final weights as ``weights-rank<r>.pt`` in the
            output folder (tests compare them with single-process references).
        fault: test hook, ``"kill:RANK:ITERATION"`` or ``"hang:RANK:ITERATION"``.
        pipeline: for the pipeline schemes, :func:`pipeline_of`'s output (stage layer
            indices, replicas, micro-batches per iteration, tail iterations); the workers
            are then the pipeline's ranks and ``batch_size`` its mini-batch.
        data: ``""`` (random inputs and labels) or a data set of :mod:`realrun.data`
            (``digits``): the workers train on its training split in the order the module
            describes, and a pipeline's ranks keep their stage's weights at every epoch's
            end, saved with ``save_weights`` as ``epoch-weights-rank<r>.pt``.
        momentum: the momentum of the ``momentum`` optimizer.
    """

    scheme: str
    model: str
    workers: int
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    servers: int = 0
    dedicated_servers: bool = False
    batch_size: int = DEFAULT_REAL_BATCH
    iterations: int = 5
    warmup_iterations: int = 1
    seed: int = 0
    optimizer: str = "momentum"
    lr: float = 0.01
    backend: str = "gloo"
    timeout_s: float = 120.0
    record_layers: bool = True
    profile: bool = False
    save_weights: bool = False
    fault: str = ""
    pipeline: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    input_shape: tuple[int, ...] | None = None
    data: str = ""
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if self.data and self.data not in DATASETS:
            raise JobError(
                "data", f"{self.data!r} is not allowed; choose one of: {', '.join(DATASETS)}"
            )
        cls = real_scheme(self.scheme)
        if self.backend not in BACKENDS:
            raise JobError(
                "backend",
                f"{self.backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}",
            )
        if self.workers < 1:
            raise JobError("gpus", f"{self.workers} is not allowed; need at least 1 rank")
        if cls.parameter_servers and self.servers < 1:
            raise JobError(
                "scheme.servers",
                f"{self.servers} is not allowed; {self.scheme} needs at least one server",
            )
        if cls.pipeline:
            if not self.pipeline:
                raise JobError(
                    "scheme", f"{self.scheme} needs a pipeline plan (realrun.job.pipeline_of)"
                )
            chunks = int(self.pipeline.get("chunks", 1))
            if sum(self.pipeline["replicas"]) != self.workers * chunks:
                raise JobError(
                    "gpus",
                    f"{self.workers} ranks, but the plan's stages take "
                    f"{sum(self.pipeline['replicas']) // chunks}",
                )
        if self.input_shape is not None:
            object.__setattr__(self, "input_shape", tuple(int(d) for d in self.input_shape))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))
        object.__setattr__(self, "pipeline", MappingProxyType(dict(self.pipeline)))

    @property
    def world_size(self) -> int:
        """Workers plus servers."""
        return self.workers + self.servers

    @property
    def total_iterations(self) -> int:
        """Warm-up plus measured iterations."""
        return self.warmup_iterations + self.iterations

    @property
    def hosts(self) -> int:
        """Hosts of the emulated cluster: one per worker, plus one per dedicated server."""
        return self.workers + (self.servers if self.dedicated_servers else 0)

    def host_of(self, rank: int) -> int:
        """The host of ``rank`` (see module docs)."""
        if rank < self.workers:
            return rank
        s = rank - self.workers
        return self.workers + s if self.dedicated_servers else s % self.workers

    def role(self, rank: int) -> str:
        """``worker`` or ``server``."""
        return "worker" if rank < self.workers else "server"

    def device_name(self, rank: int) -> str:
        """The name of ``rank`` in timelines: ``n<host>.rank<r>`` for a worker and
        ``n<host>.cpu0/ps<s>`` for a server (the simulator's name of a server)."""
        host = self.host_of(rank)
        if rank < self.workers:
            return f"n{host}.rank{rank}"
        return f"n{host}.cpu0/ps{rank - self.workers}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dictionary."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["options"] = dict(self.options)
        d["pipeline"] = dict(self.pipeline)
        d["input_shape"] = list(self.input_shape) if self.input_shape is not None else None
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """The job of :meth:`to_dict`'s output."""
        return cls(**dict(data))

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the job as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Job:
        """Read a job written by :meth:`write`."""
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))


# ---- making a job ------------------------------------------------------------------------


def pipeline_of(config: Any) -> dict[str, Any]:
    """A job's ``pipeline``: the plan ``sim run`` lays ``config`` (a
    :class:`~simcore.config.SimConfig` of a pipeline scheme) out with
    (:meth:`~simcore.schemes._pipeline.PipelineScheme.plan` on the configuration's trace),
    as plain data: ``{"stage_layers", "replicas", "microbatches", "tail", "partition",
    "chunks", "out_bytes"}`` (``out_bytes``: what crosses after each stage, whole batch).
    ``ConfigError`` where the simulator refuses the configuration; :class:`JobError` where
    a real micro-batch would not hold whole samples."""
    from simcore.engine import resolve_topology
    from simcore.schemes import get_scheme

    cls = get_scheme(config.scheme)
    opts = config.options if config.options is not None else cls.Options()
    topology = resolve_topology(config, cls.dedicated_servers(opts, config.gpus))
    cls.check(config, opts, topology)
    plan = cls.plan(config, opts, topology, config.trace)
    m, batch_size = plan.microbatches, config.effective_batch_size
    if batch_size % m:
        up = -(-batch_size // m) * m
        raise JobError(
            "batch_size",
            f"batch size {batch_size} is not a multiple of the {m} micro-batches (a real "
            f"micro-batch needs whole samples, all of one size); use e.g. --batch-size {up} "
            "or set scheme.microbatches",
        )
    # a micro-batch count the schedule cannot take is refused before any rank starts
    cls.schedule_for(plan, 1, opts)
    part = plan.partition
    return {
        "stage_layers": [list(s.layers) for s in part.stages],
        "replicas": list(part.replicas),
        "microbatches": m,
        "tail": plan.tail,
        "partition": part.method,
        "chunks": plan.features.chunks,
        "out_bytes": [s.out_bytes for s in part.stages],
    }


def scheme_options(scheme: str, options: Mapping[str, Any]) -> Any:
    """``scheme``'s options dataclass from ``options`` by name over its defaults, checked
    as ``sim run`` checks them (``ConfigError`` naming ``scheme.<option>``)."""
    from simcore.config import options_from_mapping

    return options_from_mapping(real_scheme(scheme).Options, dict(options), prefix="scheme.")


def server_ranks(scheme: str, options: Mapping[str, Any], workers: int) -> int:
    """The parameter-server ranks a real run of ``scheme`` with ``options`` (by name) on
    ``workers`` workers adds (:meth:`~simcore.schemes.base.Scheme.server_ranks`)."""
    return real_scheme(scheme).server_ranks(scheme_options(scheme, options), workers)


def job_from_spec(
    scheme: str,
    workers: int,
    options: Mapping[str, Any] | None = None,
    *,
    plan_config: Any = None,
    **fields: Any,
) -> Job:
    """The :class:`Job` of ``scheme`` on ``workers`` workers, by the rules of a real run,
    each held once by the scheme's class (:mod:`simcore.schemes`): the scheme must have a
    real runtime (``real_runtime``), take ``options`` (by name, over its defaults; a
    ``ConfigError`` names a bad one) and the workers (``real_refusal``) and run on the
    backend asked (``real_backends``; :class:`JobError` otherwise); a scheme with
    parameter servers adds its server ranks (``server_ranks``, on hosts of their own
    where ``dedicated_servers`` says so), and a pipeline carries the plan
    (:func:`pipeline_of`) of ``plan_config``: the simulated configuration whose stages the
    run follows, or a function of the run's options (every one, by name) that makes it,
    called for a pipeline only. ``fields`` are the job's other fields (``model``,
    ``batch_size``, ``iterations``...). The job holds every option by name."""
    from simcore.schemes import get_scheme, schemes_where

    cls = real_scheme(scheme)
    opts = scheme_options(scheme, options or {})
    why = cls.real_refusal(opts, workers)
    if why is not None:
        raise JobError(*why)
    backend = fields.get("backend", "gloo")
    if backend in BACKENDS and backend not in cls.real_backends:
        able = [n for n in schemes_where("real_runtime") if backend in get_scheme(n).real_backends]
        raise JobError(
            "backend",
            f"{backend} runs {', '.join(able)} only; {scheme} exchanges messages with tags "
            "over gloo (use --backend gloo)",
        )
    by_name = {f.name: getattr(opts, f.name) for f in dataclasses.fields(opts)}
    pipeline: dict[str, Any] = {}
    if cls.pipeline:
        config = plan_config(by_name) if callable(plan_config) else plan_config
        if config is None:
            raise TypeError(f"a {scheme} job needs the simulated configuration it follows")
        pipeline = pipeline_of(config)
    return Job(
        scheme=scheme,
        workers=workers,
        options=by_name,
        servers=cls.server_ranks(opts, workers),
        dedicated_servers=cls.dedicated_servers(opts, workers) > 0,
        pipeline=pipeline,
        **fields,
    )
