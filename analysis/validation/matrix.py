"""The validation matrix: its :class:`Case`\\ s and the matrices made of them.

A :class:`Case` is one scheme x model x link bandwidth x rank count, plus batch size,
iterations and the scheme options that fix its micro-batch. :func:`build_matrix` makes
the development matrix (the one the model is tuned on, or any part of it that
``sim validate`` chooses), :func:`heldout_matrix` the held-out one and
:func:`quick_matrix` the small one of ``--quick``; :func:`case_from_row` gives back the
case of a table row. Every bad choice is a ``ConfigError`` naming the setting.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from analysis.matrix_defaults import (
    BATCH,
    ITERATIONS,
    MAX_ITERATIONS,
    MIN_MEASURED_S,
    RANKS,
    WARMUP_ITERATIONS,
)
from simcore.config import ConfigError
from simcore.schemes import get_scheme
from simcore.units import parse_rate

SCHEMES = ("dp", "ps", "p3", "gossip", "mp", "gpipe", "pipedream", "spectrain")
"""The schemes the validation matrices cover: the eight of the seed papers, each with a
real runtime (``schemes_where("real_runtime")``); the pipeline schedules of
:mod:`simcore.pipeline_schedules` run for real but are not in the matrices yet."""

PIPELINES = tuple(s for s in SCHEMES if get_scheme(s).pipeline)
"""Those of :data:`SCHEMES` whose class is a pipeline's."""

MODELS = ("mlp_medium", "cnn_medium")
"""The default models: an MLP whose gradients are large next to its compute, and a CNN
whose compute dominates."""

BANDWIDTHS = ("200Mbps", "1Gbps")
"""The default link rates of the emulated cluster."""

MIN_RANKS, MAX_RANKS = 2, 4
"""Ranks a validation case may have: at least two (something to communicate), at most four
(a parameter-server case then has eight processes on this machine's cores)."""

QUICK: tuple[tuple[str, str, str, int], ...] = (
    ("dp", "mlp_medium", "1Gbps", 2),
    ("ps", "mlp_medium", "1Gbps", 2),
    ("gpipe", "cnn_medium", "1Gbps", 2),
    ("pipedream", "mlp_medium", "1Gbps", 3),
)
"""The ``--quick`` matrix: data parallelism, a parameter server and two pipelines."""


def _options_for(scheme: str, ranks: int) -> tuple[tuple[str, Any], ...]:
    """Scheme options a validation case fixes so that the micro-batch is known up front,
    for a pipeline that chooses its micro-batches: four for one with a flush (GPipe), one
    per rank on straight stages for one that updates after every micro-batch (PipeDream,
    SpecTrain; replicated stages would need the micro-batches to be a multiple of the
    replicas)."""
    cls = get_scheme(scheme)
    if not cls.pipeline or cls.features.microbatches:
        return ()
    if not cls.update_per_microbatch:
        return (("microbatches", 4),)
    return (("microbatches", ranks),) + ((("straight", True),) if not cls.features.straight else ())


@dataclass(frozen=True)
class Case:
    """One validation case.

    Attributes:
        scheme: one of :data:`SCHEMES`.
        model: a zoo model name (or a user model reference ``FILE.py:NAME``).
        bandwidth_bytes_per_s: the rate every emulated host link is shaped to.
        ranks: workers (a pipeline's stages; ``ps``/``p3`` add as many servers).
        batch_size: samples per worker per iteration (a pipeline: its mini-batch).
        iterations: measured iterations (at least; see ``min_measured_s``).
        warmup_iterations: iterations run first and left out.
        options: scheme options, as ``(key, value)`` pairs.
        input_shape: per-sample input shape of a user model whose callable returns only
            a module (``None`` otherwise).
        min_measured_s: seconds a real run measures at least: :meth:`planned` asks for
            more than ``iterations`` when the predicted iteration is short (0: exactly
            ``iterations``).
        run_iterations: the measured iterations :meth:`planned` settled on (0 before;
            not part of the case's identity).
    """

    scheme: str
    model: str
    bandwidth_bytes_per_s: float
    ranks: int
    batch_size: int = BATCH
    iterations: int = ITERATIONS
    warmup_iterations: int = WARMUP_ITERATIONS
    options: tuple[tuple[str, Any], ...] = ()
    input_shape: tuple[int, ...] | None = None
    min_measured_s: float = 0.0
    run_iterations: int = field(default=0, compare=False)

    @property
    def measured_iterations(self) -> int:
        """The iterations its runs and simulations measure: ``run_iterations`` once
        planned, else ``iterations``."""
        return self.run_iterations or self.iterations

    def planned(self, predicted_s: float) -> Case:
        """This case with its measured iterations settled for an iteration predicted to
        take ``predicted_s``: enough to fill ``min_measured_s``, at least ``iterations``
        and at most :data:`MAX_ITERATIONS` (or ``iterations`` if that is more)."""
        n = self.iterations
        if self.min_measured_s > 0 and predicted_s > 0:
            n = max(n, min(MAX_ITERATIONS, math.ceil(self.min_measured_s / predicted_s)))
        return replace(self, run_iterations=n)

    @property
    def bandwidth(self) -> str:
        """The rate as text, e.g. ``1Gbps`` (file names and tables)."""
        return bandwidth_label(self.bandwidth_bytes_per_s)

    @property
    def microbatches(self) -> int:
        """Micro-batches per iteration (1 for the data-parallel schemes and ``mp``)."""
        return int(dict(self.options).get("microbatches", 1))

    @property
    def case_id(self) -> str:
        """A readable, stable name: scheme, model, bandwidth, ranks, plus a hash of the
        rest (batch, iterations, options, seconds measured; not ``run_iterations``)."""
        key: list[Any] = [
            self.batch_size,
            self.iterations,
            self.warmup_iterations,
            list(self.options),
        ]
        if self.input_shape is not None:
            key.append(list(self.input_shape))
        if self.min_measured_s > 0:  # (tables from before it keep their ids)
            key.append({"min_measured_s": self.min_measured_s})
        rest = json.dumps(key, default=str)
        digest = hashlib.sha256(rest.encode()).hexdigest()[:6]
        model = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.model.rsplit("/", 1)[-1])
        return f"{self.scheme}-{model}-{self.bandwidth}-{self.ranks}r-{digest}"

    def describe(self) -> str:
        """One line: ``dp mlp_medium 1Gbps x2``."""
        return f"{self.scheme} {self.model} {self.bandwidth} x{self.ranks}"


def bandwidth_label(rate_bytes_per_s: float) -> str:
    """``125e6`` -> ``1Gbps``, ``25e6`` -> ``200Mbps`` (bits per second, no spaces)."""
    bits = rate_bytes_per_s * 8
    for unit, scale in (("Gbps", 1e9), ("Mbps", 1e6), ("kbps", 1e3)):
        if bits >= scale:
            value = bits / scale
            text = f"{value:.3f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return f"{bits:g}bps"


def allowed_ranks(scheme: str, ranks: int) -> str | None:
    """Why ``scheme`` cannot run with ``ranks`` in a validation, or ``None`` if it can."""
    if not MIN_RANKS <= ranks <= MAX_RANKS:
        return f"a validation case has {MIN_RANKS} to {MAX_RANKS} ranks"
    return get_scheme(scheme).worker_refusal(ranks)


def parse_list(name: str, text: str | Sequence[Any]) -> tuple[str, ...]:
    """``"dp, ps"`` -> ``("dp", "ps")`` (``ConfigError`` naming ``name`` if empty)."""
    items = (
        tuple(str(s).strip() for s in text)
        if isinstance(text, list | tuple)
        else tuple(s.strip() for s in str(text).split(","))
    )
    if not items or any(not s for s in items):
        raise ConfigError(name, text, "expected a comma-separated list without empty items")
    return tuple(dict.fromkeys(items))


def check_model(model: str, input_shape: tuple[int, ...] | None = None) -> str:
    """The model reference a validation runs: a zoo name as it is, a user's model
    (``FILE.py:NAME``, ``package.module:NAME``) resolved by :mod:`realrun.usermodel` (the
    file made absolute, ``NAME`` checked to exist and to build a module, with
    ``input_shape`` where it needs one). ``ConfigError`` (field ``models``) otherwise."""
    from realrun import zoo
    from realrun.usermodel import resolve_model

    if zoo.is_zoo(model):
        return model
    if not zoo.looks_like_reference(model):
        raise ConfigError(
            "models",
            model,
            "a validation runs the model for real; choose a zoo model "
            f"({', '.join(zoo.names())}), FILE.py:NAME or package.module:NAME",
        )
    try:
        return str(resolve_model(model, input_shape).ref)
    except ConfigError as exc:
        raise ConfigError("models", model, f"{exc.field}: {exc.allowed}") from None


def zoo_model(model: str) -> bool:
    """Whether ``model`` names a zoo model (not a user's)."""
    from realrun import zoo

    return bool(zoo.is_zoo(model))


def build_matrix(
    schemes: Sequence[str] = SCHEMES,
    models: Sequence[str] = MODELS,
    bandwidths: Sequence[str | float] = BANDWIDTHS,
    ranks: Sequence[int] = RANKS,
    *,
    every_rank: bool = False,
    input_shape: tuple[int, ...] | None = None,
    batch_size: int = BATCH,
    iterations: int = ITERATIONS,
    warmup_iterations: int = WARMUP_ITERATIONS,
    min_measured_s: float = MIN_MEASURED_S,
) -> tuple[Case, ...]:
    """The cases of schemes x models x bandwidths, each with a rank count from ``ranks``.

    By default each (scheme, model, bandwidth) gets one rank count, taken in turn from the
    counts the scheme allows, so that every count is covered without the whole cross
    product; ``every_rank`` takes every allowed count. ``ConfigError`` names an unknown
    scheme or model (``input_shape``: for user models returning only a module), a bad
    bandwidth, a rank count no case may have, a scheme that allows
    none of the counts, and a batch size the micro-batches do not divide.
    """
    schemes = tuple(schemes)
    for s in schemes:
        if s not in SCHEMES:
            raise ConfigError("schemes", s, f"choose from: {', '.join(SCHEMES)}")
    models = [check_model(m, input_shape) for m in models]
    rates = []
    for b in bandwidths:
        try:
            rate = parse_rate(b)
        except ValueError as exc:
            raise ConfigError(
                "bandwidths", b, f"expected a rate such as 200Mbps or 1Gbps ({exc})"
            ) from None
        if not rate > 0:
            raise ConfigError("bandwidths", b, "expected a positive rate such as 1Gbps")
        rates.append(rate)
    ranks = tuple(int(r) for r in ranks)
    for r in ranks:
        if not MIN_RANKS <= r <= MAX_RANKS:
            raise ConfigError("ranks", r, f"a validation case has {MIN_RANKS} to {MAX_RANKS} ranks")
    if batch_size < 1 or iterations < 1 or warmup_iterations < 0:
        raise ConfigError(
            "iterations", iterations, "batch and iterations must be positive, warm-up >= 0"
        )
    _check_min_measured(min_measured_s)
    per_scheme: dict[str, list[int]] = {}
    for s in schemes:
        ok = [r for r in ranks if allowed_ranks(s, r) is None]
        if not ok:
            raise ConfigError(
                "ranks",
                ",".join(map(str, ranks)),
                f"{s} {allowed_ranks(s, ranks[0])}",
            )
        per_scheme[s] = ok
    cases: list[Case] = []
    turn = 0
    for s in schemes:
        for m in models:
            for rate in rates:
                counts = per_scheme[s] if every_rank else [per_scheme[s][turn % len(per_scheme[s])]]
                turn += 1
                for r in counts:
                    case = Case(
                        s,
                        m,
                        rate,
                        r,
                        batch_size,
                        iterations,
                        warmup_iterations,
                        _options_for(s, r),
                        None if zoo_model(m) else input_shape,
                        min_measured_s,
                    )
                    cases.append(case)
    split = math.lcm(*(c.microbatches for c in cases))
    for case in cases:
        if batch_size % case.microbatches:
            raise ConfigError(
                "batch_size",
                batch_size,
                f"{case.describe()} splits it into {case.microbatches} "
                f"micro-batches; use a multiple of {split}",
            )
    return tuple(dict.fromkeys(cases))


HELDOUT_SCHEMES = SCHEMES
HELDOUT_MODELS = ("resnet_small", "transformer_small", "user_model.py:wide_mlp")
"""The held-out matrix's models: a ResNet (residual joins, batch norm) and a Transformer
(attention, embeddings) of the zoo, and a user's model by file (its path is completed to
this package's :mod:`analysis.heldout.user_model`); none was ever tuned on."""
HELDOUT_BANDWIDTHS = ("500Mbps",)
"""The held-out link rate: between the development matrix's two."""
HELDOUT_BATCH = 36
"""The held-out batch: not the development matrix's 24, divisible by 2, 3 and 4 (every
micro-batch count the pipelines take) and by GPipe's four micro-batches."""
MATRICES = ("development", "heldout")
"""The named matrices of ``sim validate --matrix``."""


def heldout_model(name: str) -> str:
    """A held-out model's reference: a zoo name as it is; ``user_model.py:NAME`` as the
    absolute ``FILE.py:NAME`` of :mod:`analysis.heldout.user_model`."""
    if not name.startswith("user_model.py:"):
        return name
    from analysis.heldout import user_model

    return f"{user_model.__file__}:{name.split(':', 1)[1]}"


def heldout_matrix(
    *,
    iterations: int = ITERATIONS,
    min_measured_s: float = MIN_MEASURED_S,
) -> tuple[Case, ...]:
    """The held-out matrix: every scheme x :data:`HELDOUT_MODELS` at
    :data:`HELDOUT_BANDWIDTHS` and batch :data:`HELDOUT_BATCH`, ranks 2-4 in turn (24
    cases). It is run only with the model frozen and its predictions registered
    (``sim validate --matrix heldout --predict-only`` first)."""
    return build_matrix(
        HELDOUT_SCHEMES,
        [heldout_model(m) for m in HELDOUT_MODELS],
        HELDOUT_BANDWIDTHS,
        RANKS,
        batch_size=HELDOUT_BATCH,
        iterations=iterations,
        min_measured_s=min_measured_s,
    )


def quick_matrix(
    *,
    iterations: int = ITERATIONS,
    batch_size: int = BATCH,
    min_measured_s: float = MIN_MEASURED_S,
) -> tuple[Case, ...]:
    """The small matrix of ``--quick`` (:data:`QUICK`)."""
    _check_min_measured(min_measured_s)
    return tuple(
        Case(
            s,
            m,
            parse_rate(b),
            r,
            batch_size,
            iterations,
            WARMUP_ITERATIONS,
            _options_for(s, r),
            min_measured_s=min_measured_s,
        )
        for s, m, b, r in QUICK
    )


def _check_min_measured(min_measured_s: float) -> None:
    if not (min_measured_s >= 0 and math.isfinite(min_measured_s)):
        raise ConfigError(
            "min_measured_s", min_measured_s, "expected seconds >= 0 (0: exactly --iterations)"
        )


def case_from_row(row: Mapping[str, Any]) -> Case:
    """The case of a table row (the scheme options in their stored order; a user
    model's ``--input-shape`` is not in the table, so such a case gets another id),
    with the iterations its runs measured (tables from before 2026-11-25 have neither
    ``min_measured_s`` nor ``run_iterations``: exactly ``iterations``)."""

    def number(key: str) -> float:
        value = row.get(key)
        return 0.0 if value is None or value != value else float(value)  # absent or NaN

    return Case(
        str(row["scheme"]),
        str(row["model"]),
        float(row["bandwidth_bytes_per_s"]),
        int(row["ranks"]),
        int(row["batch_size"]),
        int(row["iterations"]),
        int(row["warmup_iterations"]),
        tuple(json.loads(row["options"]).items()),
        min_measured_s=number("min_measured_s"),
        run_iterations=int(number("run_iterations")),
    )
