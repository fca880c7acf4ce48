"""The work a scheme's simulation does, counted before it runs: what the work guard
(:mod:`simcore.guard`) hands a scheme (:class:`Workload`) and what the scheme's
:meth:`~simcore.schemes.base.Scheme.estimate_work` answers (:class:`SchemeWork`). Plain
data, apart from the guard so that the schemes can use it without importing the guard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simcore.config import SimConfig


@dataclass(frozen=True)
class Workload:
    """What :func:`simcore.guard.estimate` knows of a run before anything is built, for a
    scheme's
    :meth:`~simcore.schemes.base.Scheme.estimate_work`.

    Attributes:
        config: the configuration.
        options: the scheme's options (its defaults when the configuration has none).
        gpus: GPUs (ranks).
        iterations: iterations simulated, warm-up included.
        layers: layers that compute (at least 1).
        param_bytes: the parameter bytes of every layer that has parameters.
        activation_bytes: the output activations of the layers that compute, summed.
        per_box: GPUs per machine (at most ``gpus``).
        boxes: machines.
    """

    config: SimConfig
    options: Any
    gpus: int
    iterations: int
    layers: int
    param_bytes: tuple[int, ...]
    activation_bytes: int
    per_box: int
    boxes: int

    @property
    def detailed(self) -> bool:
        """Whether the network is the detailed (chunked) model."""
        return self.config.fidelity == "detailed"

    @property
    def cpu_hosts(self) -> bool:
        """Whether the ranks are CPU hosts sharing cores (the preset has a ``host``
        section): every worker is simulated there, and messages cost the hosts' CPU."""
        topo = self.config.topology
        sections = getattr(topo, "sections", None)  # a TopologySpec; else a Topology
        host = sections.host if sections is not None else getattr(topo, "host_spec", None)
        return host is not None


@dataclass(frozen=True)
class SchemeWork:
    """What one scheme's simulation of a :class:`Workload` does
    (:meth:`~simcore.schemes.base.Scheme.estimate_work`).

    Attributes:
        messages: messages the network records.
        moved_bytes: bytes that cross links (chunked in the detailed model).
        compute_ops: compute ops; ``None``: a forward and a backward per layer, GPU and
            iteration.
        simulated_gpus: GPUs simulated (a mean field mirrors the others); ``None``: all.
        mean_field: whether a mean-field model is assumed.
    """

    messages: int = 0
    moved_bytes: float = 0.0
    compute_ops: int | None = None
    simulated_gpus: int | None = None
    mean_field: bool = False
