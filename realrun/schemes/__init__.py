"""The real runtimes of the data-parallel schemes, one module per scheme: ``dp`` (DDP
itself), ``ps`` and ``p3`` (parameter-server ranks), ``gossip`` (GossipGraD's pairwise
exchange); the pipeline schemes share one schedule runtime, :mod:`realrun.pipeline`. Which
runtime runs a scheme is the scheme class's own fact (``real_runtime``), so a scheme and
its runtime are added without an edit here."""

from __future__ import annotations

import importlib
from typing import Any


def get_runtime(name: str) -> Any:
    """The runtime class of scheme ``name``: its simulator class's ``real_runtime``
    (``"module:Class"``), imported now (:class:`realrun.job.JobError` when it has none)."""
    from realrun.job import real_scheme

    module, _, cls_name = real_scheme(name).real_runtime.partition(":")
    return getattr(importlib.import_module(module), cls_name)
