"""What one real run does, as plain data every rank reads: :class:`Job`.

``sim real`` resolves the user's settings (the same ``RunSpec`` as ``sim run``) into a job,
writes it as JSON next to the run's outputs and starts one process per rank, each of which
reads it. Under ``torchrun`` the same file is given with ``--job``. No torch here.

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

PS_SCHEMES = ("ps", "p3")
PIPELINE_SCHEMES = (
    "mp",
    "gpipe",
    "pipedream",
    "spectrain",
    "1f1b",
    "zb-h1",
    "interleaved",
    "looped-bfs",
    "zb-interleaved",
    "zbv",
    "dualpipev",
)
"""Schemes whose ranks are the stages of a pipeline (:mod:`realrun.pipeline`); their job
carries the plan (``pipeline``)."""
"""Schemes with parameter-server ranks."""

REAL_SCHEMES = ("dp", "ps", "p3", "gossip", *PIPELINE_SCHEMES)
"""Schemes the real runtime executes."""

DEVICES = ("cpu", "emulated")
"""What a real run computes on (``cuda`` follows from ``--backend nccl``): ``emulated`` is
a model built from a layer trace on an emulated device (:mod:`realrun.emudevice`)."""

DATASETS = ("digits",)
"""Real data sets (:mod:`realrun.data`, which holds the same tuple)."""

DEFAULT_REAL_BATCH = 8
"""Samples per worker per iteration when the user names none: a real model's trace batch
(often 64-256 on a V100) is far too much for a CPU rank."""


class JobError(ValueError):
    """A job that cannot run as asked; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class Job:
    """One real run.

    Attributes:
        scheme: ``dp``, ``ps``, ``p3`` or ``gossip``.
        options: the scheme's options, already validated, as plain values (the fields of
            the simulator's options dataclass for the scheme).
        model: the model reference (:mod:`realrun.usermodel`): a zoo model name, or
            ``/absolute/path/file.py:NAME`` or ``package.module:NAME`` for a user's model.
        input_shape: the per-sample shape of a user model's one input when its callable
            returns only a module (``None`` otherwise).
        workers: data-parallel workers (``--gpus``).
        servers: parameter-server ranks (0 unless ``ps``/``p3``).
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
        pipeline: for the pipeline schemes, :func:`realrun.pipeline.plan`'s output (stage
            layer indices, replicas, micro-batches per iteration, tail iterations); the
            workers are then the pipeline's ranks and ``batch_size`` its mini-batch.
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
                f"data: {self.data!r} is not allowed; choose one of: {', '.join(DATASETS)}"
            )
        if self.scheme not in REAL_SCHEMES:
            raise JobError(
                f"scheme: {self.scheme!r} has no real runtime yet; choose one of: "
                f"{', '.join(REAL_SCHEMES)}"
            )
        if self.backend not in BACKENDS:
            raise JobError(
                f"backend: {self.backend!r} is not allowed; choose one of: {', '.join(BACKENDS)}"
            )
        if self.workers < 1:
            raise JobError(f"gpus: {self.workers} is not allowed; need at least 1 rank")
        if self.scheme in PS_SCHEMES and self.servers < 1:
            raise JobError(
                f"scheme.servers: {self.servers} is not allowed; {self.scheme} "
                "needs at least one server"
            )
        if self.scheme in PIPELINE_SCHEMES:
            if not self.pipeline:
                raise JobError(
                    f"scheme: {self.scheme} needs a pipeline plan (realrun.pipeline.plan)"
                )
            chunks = int(self.pipeline.get("chunks", 1))
            if sum(self.pipeline["replicas"]) != self.workers * chunks:
                raise JobError(
                    f"gpus: {self.workers} ranks, but the plan's stages take "
                    f"{sum(self.pipeline['replicas']) // chunks}"
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
