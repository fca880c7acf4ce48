"""Simulation configuration: frozen dataclasses with typed, documented fields.

:class:`SimConfig` is everything :func:`simcore.simulate` needs. Scheme options are
frozen dataclasses too, one per scheme, whose fields are declared with :func:`option` so
that values typed by people (``25MiB``, ``10Gbps``, ``true``) are converted once, at the
edge, by :func:`options_from_mapping`, with errors that name the field, the value and what
is allowed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from simcore.scheme_names import scheme_names
from simcore.settings import (
    TYPE_WORDS,
    ConfigError,
    convert,
    describe,
    from_mapping,
    normalise,
    parse_bool,
    parse_int,
    parse_quantity,
    setting,
)
from simcore.topology import Topology, TopologySpec
from traces.model import Trace

__all__ = [
    "FIDELITIES",
    "MIN_CHUNK_BYTES",
    "OPTIMIZERS",
    "SHARED",
    "TYPE_WORDS",
    "ConfigError",
    "RunSettings",
    "SimConfig",
    "describe_options",
    "option",
    "options_from_mapping",
    "parse_bool",
    "parse_field",
    "parse_int",
    "parse_quantity",
]

MIN_CHUNK_BYTES = 4096
"""Smallest chunk of the detailed network model."""

FIDELITIES = ("detailed", "analytic")
"""Network fidelities: chunked queues, or closed forms (see :mod:`simcore.network`)."""

OPTIMIZERS = {"sgd": (0, 3), "momentum": (1, 5), "adam": (2, 8)}
"""Optimizer -> (state copies of the weights, weight-sized memory passes per update).

State copies drive the memory model (momentum keeps one velocity per weight, Adam two
moments); passes drive the update time, ``passes * param_bytes / memory_bandwidth``
(an update is memory-bound: read weights, gradients and state, write weights and state).
"""


def option(
    default: Any,
    help: str,
    *,
    unit: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
) -> Any:
    """A scheme option: a :func:`~simcore.settings.setting` whose ``unit`` is ``bytes``,
    ``rate`` (bytes/s) or ``seconds``; ``choices`` lists the allowed strings; ``minimum``
    bounds numbers from below."""
    return setting(default, help, kind=unit, choices=choices, minimum=minimum)


def parse_field(f: dataclasses.Field, value: Any, where: str) -> Any:
    """Convert ``value`` to the type of option field ``f`` (:func:`simcore.settings.convert`)."""
    return convert(f, value, where)


options_from_mapping = from_mapping
describe_options = describe


def _scheme_names() -> tuple[str, ...]:
    return scheme_names()


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """The settings that both a person's :class:`~simcore.spec.RunSpec` and the simulator's
    :class:`SimConfig` carry, declared once (see :mod:`simcore.settings`).

    Attributes:
        scheme: registry name of the training scheme (``dp``, ``ps``, ...).
        batch_size: samples per model replica per iteration (per GPU for data-parallel
            schemes, per pipeline for pipeline schemes); ``None`` keeps the trace's (a
            person's :class:`~simcore.spec.RunSpec` that names no model asks for
            :data:`~simcore.spec.DEFAULT_MODEL_BATCH`).
        iterations: measured iterations (after the warm-up ones).
        warmup_iterations: iterations simulated first and left out of the metrics.
        seed: seeds the random generators (used when ``compute_jitter > 0`` and by a
            topology with a ``network.flow_spread``, which draws its uplinks' rates).
        fidelity: ``detailed`` or ``analytic`` network model.
        chunk_bytes: message chunk size of the detailed network model.
        compute_jitter: coefficient of variation of each compute op's duration
            (log-normal, mean 1); 0 makes the run deterministic without a generator.
        optimizer: ``sgd``, ``momentum`` or ``adam`` (memory and update time, see
            :data:`OPTIMIZERS`).
    """

    scheme: str = setting(
        "dp", "training scheme (see 'sim schemes')", choices=_scheme_names, flag=1
    )
    batch_size: int | None = setting(
        None,
        "samples per model replica per iteration (per GPU for data parallelism)",
        kind="int",
        minimum=1,
        auto="the trace's; 64 for the default model, whose profile's batch of 128 does not "
        "fit a 16 GiB V100",
        auto_zero=True,
        flag=6,
    )
    iterations: int = setting(5, "measured iterations (after the warm-up ones)", minimum=1, flag=7)
    warmup_iterations: int = setting(
        1, "warm-up iterations, simulated first and left out of the metrics", minimum=0
    )
    seed: int = setting(
        0,
        "random seed (compute_jitter, and the uplink rates of a calibrated flow_spread)",
        minimum=0,
        flag=8,
    )
    fidelity: str = setting(
        "detailed",
        "network model: chunked link queues, or closed forms (fast, for thousands of GPUs)",
        choices=FIDELITIES,
        flag=9,
    )
    chunk_bytes: int = setting(
        1 << 20,
        "message chunk size of the detailed network model",
        kind="bytes",
        minimum=MIN_CHUNK_BYTES,
        limit_help=f"must be at least {MIN_CHUNK_BYTES} bytes (4KiB): "
        "smaller chunks only multiply events",
    )
    compute_jitter: float = setting(
        0.0,
        "coefficient of variation of compute times (log-normal, mean 1)",
        minimum=0.0,
        below=10.0,
        limit_help="must be in [0, 10)",
    )
    optimizer: str = setting(
        "momentum", "optimizer (memory and update time)", choices=tuple(OPTIMIZERS)
    )

    def __post_init__(self) -> None:
        normalise(self, SHARED)


SHARED = tuple(f.name for f in dataclasses.fields(RunSettings))
"""Names of the settings declared by :class:`RunSettings`."""


@dataclass(frozen=True)
class SimConfig(RunSettings):
    """Everything one simulation needs: the :class:`RunSettings` plus the objects they
    apply to.

    Attributes:
        trace: the model's layer trace (any batch size; rescaled to ``batch_size``).
        topology: a :class:`TopologySpec` (built inside the simulation, which lets a scheme
            add parameter-server hosts) or a ready :class:`Topology`.
        options: the scheme's options dataclass instance; ``None`` means its defaults.
        compute_scale: throughput of the target GPU relative to the trace's device
            (2.0 halves every compute time); a person's spec may leave it to
            :func:`analysis.resolve.build_config`, which derives it from peak FLOP/s.
        record_spans: keep span records (needed for Chrome traces; metrics do not need
            them).

    The settings of :class:`RunSettings` are keyword-only.
    """

    trace: Trace
    topology: TopologySpec | Topology
    options: Any = None
    compute_scale: float = setting(
        1.0,
        "target GPU throughput / trace device throughput",
        positive=True,
        limit_help="must be positive and finite",
    )
    record_spans: bool = True

    def __post_init__(self) -> None:
        normalise(self, (*SHARED, "compute_scale"))

    @property
    def gpus(self) -> int:
        """Number of GPUs."""
        t = self.topology
        return t.gpus if isinstance(t, TopologySpec) else t.num_gpus

    @property
    def effective_batch_size(self) -> int:
        """``batch_size``, or the trace's batch size when unset."""
        return self.batch_size or self.trace.meta.batch_size

    @property
    def total_iterations(self) -> int:
        """Warm-up plus measured iterations."""
        return self.warmup_iterations + self.iterations
