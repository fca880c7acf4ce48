"""The real runtimes of the data-parallel schemes, one module per scheme, registered by the
simulator's scheme name: ``dp`` (DDP itself), ``ps`` and ``p3`` (parameter-server ranks),
``gossip`` (GossipGraD's pairwise exchange)."""

from __future__ import annotations

import importlib
from typing import Any

RUNTIMES = {"dp": "DPRuntime", "ps": "PSRuntime", "p3": "P3Runtime", "gossip": "GossipRuntime"}
"""Scheme name -> class in ``realrun.schemes.<name>``."""


def get_runtime(name: str) -> Any:
    """The runtime class of scheme ``name``."""
    module = importlib.import_module(f"realrun.schemes.{name}")
    return getattr(module, RUNTIMES[name])
