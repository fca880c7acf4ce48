"""Validation: the simulator's predictions against real runs of the same cases.

A validation is a *matrix* of :class:`Case`\\ s (scheme x model x link bandwidth x ranks,
plus batch size and iterations). For each case the harness

1. **calibrates** the emulated cluster (:func:`prepare_calibrations`): once per bandwidth,
   all of them before the first case, the host's wake-up wait fitted over all of them
   (:func:`pool_calibrations`); or once at one rate (``calibrate_at``) that every case's
   rate is predicted from (:func:`realrun.calibrated.at_rate`: the what-if across link
   rates); or a given calibration file of any age. Kept as ``calibration/<bandwidth>.yaml``;
2. **profiles** the model on this machine (:func:`ensure_trace`; a pipeline's trace is
   profiled at its micro-batch), kept as ``traces/...json``;
3. **predicts** the case (:func:`predict_case`) from the profile and the calibration
   alone: the **prediction**, the number the validation is judged by. With
   ``sim validate --predict-only`` every case's prediction is written first, with the
   commit, the time and the inputs' hashes (:func:`register_predictions`), and a later
   run of the same folder scores them as written;
4. **runs it for real** ``repeats`` times on an emulated cluster (network namespaces,
   links shaped to the bandwidth) with the very stages the simulation used (a pipeline's
   plan is made from the same configuration);
5. **replays** each run (:func:`simulate_measured`): simulates it again on what that run
   measured (its layers' spans, its messaging threads' CPU, its send holds), a few
   times each with a little compute jitter (:class:`Ensemble`). The replay is a
   diagnostic, not a prediction: where the prediction misses and the replay does not,
   the inputs (profile, calibration) were wrong, not the model of the system;
6. appends one row (:func:`case_row`) to the store: measured iteration time (median, min,
   max and spread over the repeats), the predicted one and its error, the replay's and
   its error, throughput, bytes per link on both sides and whether they are equal,
   utilisation and bubble per rank, the calibration's age and rate, and ``why`` the
   replay misses.

Rows live in a :class:`analysis.store.SweepStore` (journal plus table), so an interrupted
validation loses no finished case and a rerun skips them. :func:`write_report` turns the
rows into ``validation.parquet``/``.csv``, ``report.md``, a scatter of predicted (and
replayed) against measured time and per-case side-by-side timelines.

No click here; ``sim validate`` (:mod:`dtsim.cli.validate`) is the command line.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from analysis.matrix_defaults import (
    BATCH,
    ITERATIONS,
    MAX_ITERATIONS,
    MIN_MEASURED_S,
    RANKS,
    REPEATS,
    SIM_JITTER,
    SIM_SEEDS,
    WARMUP_ITERATIONS,
)
from realrun.calibration.fits import segment_bytes
from realrun.owner import temp_prefix
from simcore.config import ConfigError
from simcore.units import parse_rate
from traces.atomic import write_text

SCHEMES = ("dp", "ps", "p3", "gossip", "mp", "gpipe", "pipedream", "spectrain")
"""The schemes the validation matrices cover: every one with a real runtime
(:data:`realrun.job.REAL_SCHEMES`) up to ``spectrain``; the pipeline schedules of
:mod:`simcore.pipeline_schedules` run for real but are not in the matrices yet."""

PIPELINES = ("mp", "gpipe", "pipedream", "spectrain")

MODELS = ("mlp_medium", "cnn_medium")
"""The default models: an MLP whose gradients are large next to its compute, and a CNN
whose compute dominates."""

BANDWIDTHS = ("200Mbps", "1Gbps")
"""The default link rates of the emulated cluster."""

MIN_RANKS, MAX_RANKS = 2, 4
"""Ranks a validation case may have: at least two (something to communicate), at most four
(a parameter-server case then has eight processes on this machine's cores)."""

PROFILE_ITERATIONS, PROFILE_WARMUP = 12, 2
"""Iterations of the real run a case's compute is measured in (means over the measured ones)."""
PROFILE_REPEATS = 3
"""Profile runs per trace; each layer's time is their median (as the real side's is the
median of its repeats): one run on this shared machine has been 25% off another."""

HIT = 0.05
"""A case whose |relative error| is within this is a hit; ``why`` explains the others."""

QUICK: tuple[tuple[str, str, str, int], ...] = (
    ("dp", "mlp_medium", "1Gbps", 2),
    ("ps", "mlp_medium", "1Gbps", 2),
    ("gpipe", "cnn_medium", "1Gbps", 2),
    ("pipedream", "mlp_medium", "1Gbps", 3),
)
"""The ``--quick`` matrix: data parallelism, a parameter server and two pipelines."""


# ---- the matrix -------------------------------------------------------------------------


def _options_for(scheme: str, ranks: int) -> tuple[tuple[str, Any], ...]:
    """Scheme options a validation case fixes so that the micro-batch is known up front:
    GPipe four micro-batches, PipeDream and SpecTrain one per rank on straight stages
    (replicated stages would need the micro-batches to be a multiple of the replicas)."""
    if scheme == "gpipe":
        return (("microbatches", 4),)
    if scheme == "pipedream":
        return (("microbatches", ranks), ("straight", True))
    if scheme == "spectrain":
        return (("microbatches", ranks),)
    return ()


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
    def trace_batch(self) -> int:
        """The batch of the trace the simulator needs: the micro-batch for a pipeline."""
        return self.batch_size // self.microbatches

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
    if scheme == "gossip" and ranks & (ranks - 1):
        return "pairs workers on a hypercube and needs a power of two (2 or 4)"
    return None


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


# ---- artefacts: calibration and traces -------------------------------------------------


Calibrator = Callable[[float], Mapping[str, Any]]
"""``calibrator(rate_bytes_per_s) -> topology preset mapping``."""


def default_calibrator(rate_bytes_per_s: float) -> Mapping[str, Any]:
    """Calibrate the emulated cluster at this link rate (:mod:`realrun.calibration`)."""
    from realrun.calibration.run import calibrate

    return calibrate(cluster="netns", bandwidth_bytes_per_s=rate_bytes_per_s)


def calibration_path(out_dir: str, rate_bytes_per_s: float) -> str:
    """Where the calibrated preset of this rate lives in a validation's output folder."""
    return os.path.join(out_dir, "calibration", f"{bandwidth_label(rate_bytes_per_s)}.yaml")


def ensure_calibration(
    out_dir: str, rate_bytes_per_s: float, calibrator: Calibrator = default_calibrator
) -> str:
    """The calibrated preset file for this rate: the one already in ``out_dir``, or a new
    one (calibrated now, written atomically)."""
    path = calibration_path(out_dir, rate_bytes_per_s)
    if os.path.exists(path):
        return path
    from realrun.calibration.preset import write_calibration

    preset = dict(calibrator(rate_bytes_per_s))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_calibration(preset, path)
    return path


def pool_calibrations(out_dir: str) -> list[str]:
    """Fit the host's wake-up wait once over every calibration in ``out_dir``
    (:func:`realrun.calibration.simfits.pool_wakeup`) and write it into each of them; the files
    that changed. The busy-cores benchmark behind it runs on unshaped links, so each
    bandwidth's calibration measures the same host property, and a single run of it
    moves with the machine's scheduling from one minute to the next (seen 1.55-2.1 ms
    between two calibrations started a minute apart); the validation's cases all get
    the wait fitted to every run."""
    import yaml

    from realrun.calibration.preset import write_calibration
    from realrun.calibration.simfits import pool_wakeup

    paths = _calibration_files(out_dir)
    presets = []
    for path in paths:
        with open(path) as fh:
            presets.append(yaml.safe_load(fh))

    def pooled(preset: Mapping[str, Any]) -> tuple[Any, Any]:
        fits = (preset.get("measured") or {}).get("fits") or {}
        return (preset.get("host") or {}).get("wakeup_s"), fits.get("wakeup_pooled_over")

    changed = []
    for path, before, after in zip(paths, presets, pool_wakeup(presets), strict=True):
        (was, over), (now, now_over) = pooled(before), pooled(after)
        if over != now_over or not math.isclose(was or 0.0, now or 0.0, rel_tol=1e-4):
            write_calibration(after, path)
            changed.append(path)
    return changed


def profile_scheme(scheme: str) -> str:
    """The runtime a case's compute is profiled in: the pipeline's own (its stage calls,
    weight copies and stashing are part of its compute), else the data-parallel one."""
    return scheme if scheme in PIPELINES else "dp"


def trace_path(
    out_dir: str,
    model: str,
    batch: int,
    input_shape: tuple[int, ...] | None = None,
    runtime: str = "dp",
    ranks: int = 1,
) -> str:
    """Where the trace of ``model`` at ``batch`` measured in ``runtime`` on ``ranks``
    ranks lives."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.rsplit("/", 1)[-1])
    if input_shape is not None:
        safe += "-" + "x".join(map(str, input_shape))
    if not zoo_model(model):  # two files of one name in different folders differ
        safe += "-" + hashlib.sha256(model.encode()).hexdigest()[:6]
    on = f"-{ranks}r" if ranks > 1 else ""
    return os.path.join(out_dir, "traces", f"{safe}-{runtime}{on}-b{batch}.json")


def ensure_trace(out_dir: str, case: Case, topology_file: str) -> tuple[str, dict[str, float]]:
    """The layer trace of ``case``'s model, measured on this machine now inside the
    runtime the case uses (the median of :data:`PROFILE_REPEATS` runs), and its
    optimizer step's cost (``memory_bandwidth_bytes_per_s``, ``step_overhead_s``);
    reused when ``out_dir`` already has them.

    A real run on this machine's loopback (:func:`profile_scheme`'s runtime) is turned
    into the trace by :func:`realrun.metrics.trace_from_run`, so what the runtime does
    around each layer is part of the layer's time, and each layer's time is the CPU work
    its rank's main thread did for it. A data-parallel case is profiled on one rank
    (every rank runs the whole model; communication is the simulator's). A pipeline is
    profiled with its own stages, micro-batches and schedule, since what a stage does
    around its layers (its call, receiving, weight copies) each stage pays: the
    ``--profile-out`` of a real run. The per-layer profiler's trace only gives the
    structure (parameters, activations, the graph)."""
    runtime = profile_scheme(case.scheme)
    ranks = case.ranks if runtime in PIPELINES else 1
    path = trace_path(out_dir, case.model, case.trace_batch, case.input_shape, runtime, ranks)
    rate_path = path.removesuffix(".json") + ".update.json"
    if os.path.exists(path) and os.path.exists(rate_path):
        with open(rate_path, encoding="utf-8") as fh:
            return path, json.load(fh)
    import tempfile

    from realrun.launch import launch
    from realrun.metrics import UpdateCost, median_trace, trace_from_run, update_cost
    from realrun.profiler import ProfileConfig, profile_model
    from simcore.config import OPTIMIZERS
    from traces.jsonfmt import save

    base = profile_model(
        case.model, ProfileConfig(batch_size=case.trace_batch, progress=False), case.input_shape
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    base_path = path.removesuffix(".json") + ".layers.json"
    save(base, base_path)  # the per-layer profile: the structure, kept for reference
    one = replace(
        case,
        scheme=runtime,
        ranks=ranks,
        iterations=PROFILE_ITERATIONS,
        warmup_iterations=PROFILE_WARMUP,
        options=case.options if runtime in PIPELINES else (),
    )
    config = sim_config(one, base_path, topology_file, record_spans=False)
    job = make_job(one, config)
    runs = []
    for _ in range(PROFILE_REPEATS):
        with tempfile.TemporaryDirectory(prefix=temp_prefix("validate-profile")) as tmp:
            runs.append(launch(job, tmp))
    trace = median_trace([trace_from_run(records, base) for records in runs])
    costs = [update_cost(records, base, OPTIMIZERS[job.optimizer][1]) for records in runs]
    cost = UpdateCost(
        statistics.median(c.bytes_per_s for c in costs),
        statistics.median(c.overhead_s for c in costs),
    )
    tmp_path = path + ".tmp.json"
    save(trace, tmp_path)
    os.replace(tmp_path, path)
    update = {
        "memory_bandwidth_bytes_per_s": cost.bytes_per_s,
        "step_overhead_s": cost.overhead_s,
    }
    write_text(rate_path, json.dumps(update))
    return path, update


def case_topology(
    out_dir: str,
    topology_file: str,
    trace_file: str,
    update: Mapping[str, float],
    source: str = "profile",
) -> str:
    """The calibrated preset with the optimizer step's cost measured with the trace (its
    memory bandwidth and fixed overhead, :func:`realrun.metrics.update_cost`) and, where
    ``update`` has them, SpecTrain's fixed cost of a weight prediction
    (``predict_overhead_s``), the messaging CPU per message (``p2p_message_cpu_s``),
    the sending thread's hold per ``isend`` (``isend_s``) and a pipeline's transport
    threads' CPU per message end (``posted_cpu_s``) measured in the same run; next
    to the trace; the calibration itself is left as measured. ``measured.sources`` says
    where each setting came from (:data:`realrun.calibrated.KNOBS`): the optimizer step's
    from ``source`` (``profile`` for a prediction, ``run`` for a replay), the rest from
    the run (a replay's alone)."""
    from analysis.resolve import load_preset
    from simcore.preset_keys import canonical

    preset = canonical(load_preset(topology_file))  # keys by field name
    from realrun.calibrated import knob_sources

    measured = dict(preset.get("measured") or {})
    sources = dict(measured.get("sources") or knob_sources(preset))  # (older files: none)
    sources["gpu.memory_bandwidth_bytes_per_s"] = sources["gpu.step_overhead_s"] = source
    if "predict_overhead_s" in update:
        sources["gpu.predict_overhead_s"] = "run"
    for key in ("p2p_message_cpu_s", "isend_s", "posted_cpu_s"):
        if key in update:
            sources[f"host.{key}"] = "run"
    preset["measured"] = {**measured, "sources": sources}
    preset["gpu"] = {
        **dict(preset.get("gpu") or {}),
        "memory_bandwidth_bytes_per_s": f"{update['memory_bandwidth_bytes_per_s']:.6g}B/s",
        "step_overhead_s": f"{update.get('step_overhead_s', 0.0) * 1e6:.6g}us",
    }
    if "predict_overhead_s" in update:
        preset["gpu"]["predict_overhead_s"] = f"{update['predict_overhead_s'] * 1e6:.6g}us"
    for key in ("p2p_message_cpu_s", "isend_s", "posted_cpu_s"):
        if key in update:
            preset["host"] = {**dict(preset.get("host") or {}), key: float(update[key])}
    stem = os.path.basename(topology_file).removesuffix(".yaml")
    path = trace_file.removesuffix(".json") + f"-{stem}.yaml"
    if not os.path.exists(path):
        import yaml

        write_text(path, yaml.safe_dump(preset, sort_keys=False))
    return path


# ---- the prediction ----------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """What the simulator says of a case before any of its real runs: from the model's
    profile (:func:`ensure_trace`) and the cluster's calibration only.

    Attributes:
        case: the case, its measured iterations planned on this prediction.
        iteration_time_s: the predicted iteration time.
        config: the simulated configuration (a pipeline's real run takes its plan).
        result: the simulation's :class:`~simcore.records.RunResult`.
        trace_file: the profile the simulation read.
        topology_file: the case's preset (the calibration plus the profile's step cost).
        update: the optimizer step's cost measured with the profile.
    """

    case: Case
    iteration_time_s: float
    config: Any
    result: Any
    trace_file: str
    topology_file: str
    update: Mapping[str, float]


def predict_case(case: Case, out_dir: str, calibration: str) -> Prediction:
    """Predict ``case`` on ``calibration`` (a preset file; one measured at another link
    rate is moved to the case's, :func:`analysis.resolve.preset_at_rate`) with its model's
    profile, taken now where ``out_dir`` does not hold it yet; the measured iterations
    are planned (:meth:`Case.planned`) to fill the case's seconds at the predicted time."""
    from simcore.engine import simulate

    trace_file, update = ensure_trace(out_dir, case, calibration)
    topology = case_topology(out_dir, calibration, trace_file, update)
    config = sim_config(case, trace_file, topology)
    result = simulate(config)
    planned = case.planned(result.iteration_time_s)
    if planned.measured_iterations != case.measured_iterations:
        config = sim_config(planned, trace_file, topology)
        result = simulate(config)
    return Prediction(
        planned, result.iteration_time_s, config, result, trace_file, topology, update
    )


def prediction_columns(predicted_s: float, measured_s: float) -> dict[str, float]:
    """A row's prediction columns: the predicted time and its relative error against the
    measured median (the replay's are ``sim_iteration_time_s`` and ``rel_err``)."""
    rel = (predicted_s - measured_s) / measured_s if measured_s > 0 else math.inf
    return {
        "predicted_iteration_time_s": float(predicted_s),
        "prediction_rel_err": rel,
        "abs_prediction_rel_err": abs(rel),
    }


def sha256_file(path: str) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def calibration_columns(calibration: str, case_rate_bytes_per_s: float) -> dict[str, Any]:
    """Where a case's calibration came from: its file, when it was measured, its age now
    (hours) and the link rate it was measured at (``moved`` when that is not the case's:
    the what-if :func:`realrun.calibrated.at_rate` makes)."""
    import datetime

    from analysis.resolve import load_preset, parse_when
    from realrun.calibrated import calibrated_rate

    preset = load_preset(calibration)
    measured = preset.get("measured") if isinstance(preset.get("measured"), Mapping) else {}
    when = parse_when((measured or {}).get("date"))
    age_h = (
        (datetime.datetime.now(datetime.UTC) - when).total_seconds() / 3600 if when else math.nan
    )
    rate = calibrated_rate(preset)
    return {
        "calibration": os.path.abspath(calibration) if os.path.exists(calibration) else calibration,
        "calibration_date": when.isoformat(timespec="minutes") if when else "",
        "calibration_age_h": age_h,
        "calibration_rate": bandwidth_label(rate) if rate else "",
        "calibration_moved": bool(rate) and not math.isclose(rate, case_rate_bytes_per_s),
    }


PREDICTIONS = "predictions.json"
"""The registered predictions' file in a validation's output folder."""


def predictions_path(out_dir: str) -> str:
    """Where :func:`register_predictions` writes (and the scoring reads) the predictions."""
    return os.path.join(out_dir, PREDICTIONS)


def source_commit() -> tuple[str | None, bool]:
    """``(commit, dirty)`` of the git checkout dtsim runs from; ``(None, False)`` when it
    is not one (an installed package) or git is missing."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None, False
        status = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None, False
    return head.stdout.strip(), bool(status.stdout.strip())


def load_predictions(out_dir: str) -> dict[str, Any] | None:
    """The registered predictions of ``out_dir`` (``None`` when it has none);
    ``ConfigError`` naming the file when it cannot be read."""
    path = predictions_path(out_dir)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "out", path, f"the registered predictions cannot be read ({exc})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), dict):
        raise ConfigError("out", path, "is not a predictions file (no 'cases' mapping)")
    return data


def check_registered(prediction: Prediction, entry: Mapping[str, Any], out_dir: str) -> None:
    """``ConfigError`` unless ``prediction`` was made from the very files the registered
    ``entry`` was (profile, case preset and calibration, by SHA-256) and plans the same
    iterations: a registered prediction is scored as written, never remade on other
    inputs."""
    for key, path in (
        ("trace", prediction.trace_file),
        ("topology", prediction.topology_file),
    ):
        if sha256_file(path) != entry.get(f"{key}_sha256"):
            raise ConfigError(
                "out",
                path,
                f"changed since the predictions were registered ({entry.get('registered_at')}); "
                "score them in the folder they were registered in, as it was",
            )
    if prediction.case.measured_iterations != int(entry["run_iterations"]):
        raise ConfigError(
            "iterations",
            prediction.case.measured_iterations,
            f"the registered prediction measures {entry['run_iterations']} iterations; "
            "score it with the options it was registered with",
        )


def register_predictions(
    cases: Sequence[Case],
    out_dir: str,
    calibrations: Mapping[float, str],
    *,
    command: str = "",
    progress: Callable[[Case, str], None] | None = None,
) -> dict[str, Any]:
    """Predict every case before any real run of it and write the predictions, with the
    commit, the time and the SHA-256 of every input, to ``out_dir/predictions.json``
    (:func:`predictions_path`) once: a later validation of the same folder scores them
    as written. ``calibrations``: each link rate's preset file. ``ConfigError`` when the
    folder already holds registered predictions (they are never rewritten)."""
    import datetime

    path = predictions_path(out_dir)
    if os.path.exists(path):
        raise ConfigError(
            "out",
            out_dir,
            f"already holds registered predictions ({path}); they are never "
            "rewritten: give another --out",
        )
    commit, dirty = source_commit()
    entries: dict[str, Any] = {}
    for case in cases:
        if progress:
            progress(case, "start")
        cal = calibrations[case.bandwidth_bytes_per_s]
        p = predict_case(case, out_dir, cal)
        sim = p.result.to_dict()
        entries[case.case_id] = {
            "case": case.describe(),
            "iteration_time_s": p.iteration_time_s,
            "throughput_samples_s": float(sim["throughput_samples_s"]),
            "comm_bytes_per_iteration": float(sim["comm_bytes_per_iteration"]),
            "run_iterations": p.case.measured_iterations,
            "trace": os.path.relpath(p.trace_file, out_dir),
            "trace_sha256": sha256_file(p.trace_file),
            "topology": os.path.relpath(p.topology_file, out_dir),
            "topology_sha256": sha256_file(p.topology_file),
            "calibration_sha256": sha256_file(cal),
            **calibration_columns(cal, case.bandwidth_bytes_per_s),
        }
        if progress:
            progress(case, "done")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    for entry in entries.values():
        entry["registered_at"] = now
    data = {
        "registered_at": now,
        "commit": commit,
        "dirty": dirty,
        "command": command,
        "cases": entries,
    }
    os.makedirs(out_dir, exist_ok=True)
    write_text(path, json.dumps(data, indent=1, sort_keys=True))
    return data


def prepare_calibrations(
    cases: Sequence[Case],
    out_dir: str,
    *,
    topology_file: str | None = None,
    calibrate_at: float | None = None,
    calibrator: Calibrator = default_calibrator,
    progress: Callable[[Case, str], None] | None = None,
) -> dict[float, str]:
    """The preset file each case's link rate is simulated on: ``topology_file`` for every
    rate where given (a calibrated one is moved to each case's rate when simulated);
    else one calibration at ``calibrate_at`` for every rate (the what-if across link
    rates); else one calibration per rate, all taken before the first case so that the
    host's wake-up wait is fitted over all of them (:func:`pool_calibrations`). Kept in
    ``out_dir/calibration/`` and reused."""
    rates = list(dict.fromkeys(c.bandwidth_bytes_per_s for c in cases))
    if topology_file is not None:
        return dict.fromkeys(rates, topology_file)
    if calibrate_at is not None:
        if not (calibrate_at > 0 and math.isfinite(calibrate_at)):
            raise ConfigError("calibrate_at", calibrate_at, "expected a positive link rate")
        if not os.path.exists(calibration_path(out_dir, calibrate_at)) and progress and cases:
            progress(replace(cases[0], bandwidth_bytes_per_s=calibrate_at), "calibrate")
        return dict.fromkeys(rates, ensure_calibration(out_dir, calibrate_at, calibrator))
    fresh = False
    calibrations: dict[float, str] = {}
    for case in cases:
        rate = case.bandwidth_bytes_per_s
        if rate in calibrations:
            continue
        if not os.path.exists(calibration_path(out_dir, rate)):
            if progress:
                progress(case, "calibrate")
            fresh = True
        calibrations[rate] = ensure_calibration(out_dir, rate, calibrator)
    if fresh:
        pool_calibrations(out_dir)
    return calibrations


# ---- one case ---------------------------------------------------------------------------


def sim_config(
    case: Case, trace_file: str, topology_file: str, *, record_spans: bool = True
) -> Any:
    """The simulator's configuration of ``case``: the profiled trace on the calibrated
    preset (whose fitted link rate and latency are used as they are), no device
    rescaling, and the network cut into the calibration's chunks
    (:func:`realrun.calibration.fits.segment_bytes`): a message crosses two shaped hops (its
    sender's link, then its receiver's), and TCP pipelines them segment by segment (or
    frame by frame), where 1 MiB chunks stored and forwarded would double a message's
    time."""
    from analysis.resolve import build_config, load_preset
    from simcore.spec import RunSpec

    settings: dict[str, Any] = {
        "scheme": case.scheme,
        "gpus": case.ranks,
        "model": trace_file,
        "topology": topology_file,
        "batch_size": case.batch_size,
        "iterations": case.measured_iterations,
        "warmup_iterations": case.warmup_iterations,
        "compute_scale": 1.0,
        "chunk_bytes": segment_bytes(load_preset(topology_file)),
        # a calibration measured at another rate is moved to the case's
        # (analysis.resolve.preset_at_rate); at its own rate nothing changes
        "bandwidth": case.bandwidth_bytes_per_s,
    }
    settings.update({f"scheme.{k}": v for k, v in case.options})
    return build_config(RunSpec().replace(**settings), record_spans=record_spans)


@dataclass(frozen=True)
class Ensemble:
    """How each real run is simulated: ``seeds`` simulations, each with its own seed of
    ``compute_jitter`` = ``jitter`` (every op's CPU work times a log-normal factor of mean
    1), whose mean iteration time is the run's prediction.

    On shared cores a tiny change (which thread takes a core first, which message a link
    sends first) can switch a simulated pipeline or parameter server between modes that
    differ by 10% and more, as the real runs switch; one deterministic simulation reads
    as whichever mode it happened to land in. The mean over a few perturbed ones is the
    expected time, and their range shows whether the simulation itself has modes.
    ``jitter=0`` is the single deterministic simulation (whatever ``seeds``).
    """

    seeds: int = SIM_SEEDS
    jitter: float = SIM_JITTER

    def __post_init__(self) -> None:
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise ConfigError("sim_seeds", self.seeds, "expected a whole number, 1 or more")
        if not (0 <= self.jitter < 1):
            raise ConfigError(
                "sim_jitter", self.jitter, "expected a coefficient of variation in [0, 1)"
            )

    @property
    def runs(self) -> int:
        """Simulations per real run: ``seeds``, or one without jitter (all would agree)."""
        return self.seeds if self.jitter > 0 else 1


@dataclass(frozen=True)
class Simulated:
    """A real run's simulations (:class:`Ensemble`).

    Attributes:
        result: the simulation whose iteration time is nearest their mean (its spans,
            utilisation and bubble are the ones reported).
        times_s: every simulation's iteration time, in seed order.
    """

    result: Any
    times_s: tuple[float, ...]

    @property
    def iteration_time_s(self) -> float:
        """The mean of :attr:`times_s`."""
        return statistics.fmean(self.times_s)


def simulate_ensemble(config: Any, ensemble: Ensemble) -> Simulated:
    """Simulate ``config`` as ``ensemble`` says (seeds 0, 1, ... of its jitter)."""
    from simcore.engine import simulate

    results = [
        simulate(replace(config, seed=seed, compute_jitter=ensemble.jitter))
        for seed in range(ensemble.runs)
    ]
    times = tuple(r.iteration_time_s for r in results)
    mean = statistics.fmean(times)
    best = min(range(len(results)), key=lambda k: abs(times[k] - mean))
    return Simulated(results[best], times)


def make_job(case: Case, config: Any, *, timeout_s: float = 60.0) -> Any:
    """The real run of ``case``; a pipeline gets the plan of the simulated configuration
    ``config`` (:func:`realrun.pipeline.plan`), so both run the same stages."""
    import dataclasses

    from realrun.job import PIPELINE_SCHEMES, PS_SCHEMES, Job

    opts = {f.name: getattr(config.options, f.name) for f in dataclasses.fields(config.options)}
    servers, dedicated = 0, False
    if case.scheme in PS_SCHEMES:
        dedicated = opts["placement"] == "dedicated"
        servers = int(opts["servers"]) or case.ranks
    pipeline: dict[str, Any] = {}
    if case.scheme in PIPELINE_SCHEMES:
        from realrun.pipeline import plan

        try:
            pipeline = plan(config)
        except ValueError as exc:
            raise ConfigError("batch_size", case.batch_size, str(exc)) from None
    return Job(
        scheme=case.scheme,
        model=case.model,
        input_shape=case.input_shape,
        workers=case.ranks,
        options=opts,
        servers=servers,
        dedicated_servers=dedicated,
        pipeline=pipeline,
        batch_size=case.batch_size,
        iterations=case.measured_iterations,
        warmup_iterations=case.warmup_iterations,
        seed=0,
        optimizer=config.optimizer,
        backend="gloo",
        timeout_s=timeout_s,
    )


RealRunner = Callable[[Any, float, int], list[dict[str, Any]]]
"""``runner(job, rate_bytes_per_s, repeats) -> [records of each repeat]``."""


def netns_runner(prefix: str | None = None) -> RealRunner:
    """Runs a job ``repeats`` times on one emulated cluster shaped to the rate."""

    def run(job: Any, rate: float, repeats: int) -> list[dict[str, Any]]:
        import tempfile

        from realrun.launch import Placement, launch
        from realrun.netns import EmulatedCluster, terminate_as_interrupt

        pre = prefix or os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
        out: list[dict[str, Any]] = []
        with (
            tempfile.TemporaryDirectory(prefix=temp_prefix("validate")) as tmp,
            terminate_as_interrupt(),
            EmulatedCluster(job.hosts, rate, prefix=pre) as emu,
        ):
            placement = Placement(emu.command, emu.hosts[0].address, lambda h: emu.hosts[h].ifname)
            for i in range(repeats):
                out.append(launch(job, os.path.join(tmp, f"run{i}"), placement))
        return out

    return run


_SWITCH_LINK = re.compile(r"^(n\d+)(?:\.[^-]*)?->switch$|^switch->(n\d+)(?:\.\S*)?$")


def host_links(by_link: Mapping[str, Any]) -> dict[str, int]:
    """Bytes on each host's link to the switch, named as a real run names them
    (``n0->switch``, ``switch->n1``): the simulator's ``n0.nic0->switch`` becomes
    ``n0->switch``; links inside a host are left out; links that carried nothing too."""
    out: dict[str, int] = {}
    for name, v in by_link.items():
        m = _SWITCH_LINK.match(name)
        if not m or not v:
            continue
        key = f"{m.group(1)}->switch" if m.group(1) else f"switch->{m.group(2)}"
        out[key] = out.get(key, 0) + int(v)
    return dict(sorted(out.items()))


def _pair_links(pairs: Mapping[tuple[str, str], int]) -> dict[str, int]:
    """Bytes between hosts (``(src, dst) -> bytes``, ``n<h>`` names) as bytes on the hosts'
    links to the switch."""
    out: dict[str, int] = {}
    for (a, b), v in pairs.items():
        if a == b or not v:
            continue
        for key in (f"{a}->switch", f"switch->{b}"):
            out[key] = out.get(key, 0) + int(v)
    return dict(sorted(out.items()))


def measured_links_real(records: Mapping[str, Any]) -> dict[str, int]:
    """Bytes on each host link in the measured iterations of a real run (by the iteration
    the sender tagged each message with)."""
    job = records["job"]
    first = int(job["warmup_iterations"])
    last = first + int(job["iterations"]) - 1
    host = {r["rank"]: f"n{r['host']}" for r in records["ranks"]}
    pairs: dict[tuple[str, str], int] = {}
    for r in records["ranks"]:
        for dst, it, nbytes, _kind in r["sent"]:
            if first <= it <= last:
                key = (host[r["rank"]], host[dst])
                pairs[key] = pairs.get(key, 0) + int(nbytes)
    return _pair_links(pairs)


def measured_links_sim(result: Any) -> dict[str, int]:
    """Bytes on each host link in the measured iterations of a simulation, from its
    message spans (each send joined to its receive by the flow id)."""
    first = int(result.warmup_iterations)
    last = first + int(result.iterations) - 1
    receiver = {s[10]: s[0] for s in result.spans if s[1] == "recv"}
    pairs: dict[tuple[str, str], int] = {}
    for s in result.spans:
        if s[1] == "send" and first <= s[6] <= last and s[10] in receiver:
            key = (s[0].split(".")[0], receiver[s[10]].split(".")[0])
            pairs[key] = pairs.get(key, 0) + int(s[9])
    return _pair_links(pairs)


def without_shuffle_labels(real: Mapping[str, Any]) -> dict[str, Any]:
    """A gossip run with ``shuffle`` as the simulator counts it: without the labels that
    travel with each shuffled batch (the simulator moves the inputs only). Every worker
    sends one batch to its partner and receives one per iteration, warm-up included, so
    each host link carries the same label bytes per iteration: ``shuffle_label_bytes``
    (one worker's, over the measured iterations) over the measured iterations."""
    labels = real.get("shuffle_label_bytes") or 0
    if not labels:
        return dict(real)
    per_it = labels / int(real["iterations"])
    total_its = int(real["iterations"]) + int(real["warmup_iterations"])
    out = dict(real)
    out["comm_bytes_by_link"] = {
        k: v - round(per_it * total_its) if _SWITCH_LINK.match(k) else v
        for k, v in real["comm_bytes_by_link"].items()
    }
    out["comm_bytes_per_iteration"] = real["comm_bytes_per_iteration"] - per_it * real["gpus"]
    out["bytes_adjusted"] = "shuffled batches' labels left out"
    return out


def _busy_s(result: Mapping[str, Any]) -> float:
    """Mean compute seconds per measured iteration over the ranks (utilisation x time)."""
    util = list(result["per_gpu_utilization"]) or [0.0]
    return float(result["iteration_time_s"]) * sum(util) / len(util)


SEND_HOLD_SHARE = 0.2
"""A too-fast case's ``why`` names the real runs' send holds
(:func:`realrun.metrics.send_hold_s`) when they come to at least this share of the miss."""


def why_missed(
    rel_err: float,
    real_range_s: tuple[float, float],
    sim: Mapping[str, Any],
    real: Mapping[str, Any],
) -> str:
    """Why a case's simulated iteration time misses the measured one by more than
    :data:`HIT` (empty for a hit): inside the noise band of the real runs (the simulated
    time lies between the fastest and the slowest of them), or the term that differs
    most: compute (busy time per iteration) or the rest (communication and waiting),
    and, for a case predicted too fast, how long the real ranks' sends held them
    (``real["send_hold_s"]``) where that is a good part of the miss."""
    if abs(rel_err) <= HIT:
        return ""
    lo, hi = real_range_s
    t_sim = float(sim["iteration_time_s"])
    if lo <= t_sim <= hi:
        return (
            f"within the noise band: the real runs took {1e3 * lo:.1f} to {1e3 * hi:.1f} ms "
            f"(error {100 * rel_err:+.1f}%)"
        )
    t_sim, t_real = float(sim["iteration_time_s"]), float(real["iteration_time_s"])
    c_sim, c_real = _busy_s(sim), _busy_s(real)
    o_sim, o_real = t_sim - c_sim, t_real - c_real
    d_compute, d_other = c_sim - c_real, o_sim - o_real
    if abs(d_compute) >= abs(d_other):
        term, a, b, d = "compute", c_sim, c_real, d_compute
    else:
        term, a, b, d = "communication and waiting", o_sim, o_real, d_other
    why = (
        f"{term} per iteration differs most: simulated {1e3 * a:.1f} ms, measured "
        f"{1e3 * b:.1f} ms ({'+' if d >= 0 else ''}{1e3 * d:.1f} ms of the "
        f"{'+' if t_sim >= t_real else ''}{1e3 * (t_sim - t_real):.1f} ms)"
    )
    hold = float(real.get("send_hold_s", 0.0))
    if t_sim < t_real and hold >= SEND_HOLD_SHARE * (t_real - t_sim):
        why += (
            f"; a real rank's sends held its main thread {1e3 * hold:.1f} ms per iteration "
            "(simulated as every send's mean hold, host.isend_s)"
        )
    return why


def _compact(values: Sequence[float]) -> str:
    return json.dumps([round(float(v), 4) for v in values])


def case_row(
    case: Case, sim: Mapping[str, Any], reals: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One row of the table from the simulated result and the measured ones (``sim run
    --json`` / ``sim real --json`` dictionaries). The measured values are those of the
    median run (by iteration time); the spread is ``(max - min) / median``."""
    times = [float(r["iteration_time_s"]) for r in reals]
    med = statistics.median(times)
    median_run = min(reals, key=lambda r: abs(float(r["iteration_time_s"]) - med))
    t_sim = float(sim["iteration_time_s"])
    spread = (max(times) - min(times)) / med if med > 0 else math.inf
    rel = (t_sim - med) / med if med > 0 else math.inf
    if "measured_bytes_by_link" in sim:
        # the simulator ran lead or tail iterations the real run does not: compare the
        # measured iterations' bytes, link by link
        links_sim = dict(sim["measured_bytes_by_link"])
        links_real = [dict(r["measured_bytes_by_link"]) for r in reals]
    else:
        links_sim = host_links(sim["comm_bytes_by_link"])
        links_real = [host_links(r["comm_bytes_by_link"]) for r in reals]
    per_it_sim = float(sim["comm_bytes_per_iteration"])
    per_it_real = [float(r["comm_bytes_per_iteration"]) for r in reals]
    exact = all(lr == links_sim for lr in links_real) and all(p == per_it_sim for p in per_it_real)
    diff = max(
        (
            abs(lr.get(k, 0) - links_sim.get(k, 0))
            for lr in links_real
            for k in set(lr) | set(links_sim)
        ),
        default=0,
    )
    real_for_why = dict(median_run, iteration_time_s=med)
    return {
        "point_id": case.case_id,
        "status": "ok",
        "scheme": case.scheme,
        "model": case.model,
        "bandwidth": case.bandwidth,
        "bandwidth_bytes_per_s": case.bandwidth_bytes_per_s,
        "ranks": case.ranks,
        "batch_size": case.batch_size,
        "microbatches": case.microbatches,
        "iterations": case.iterations,
        "min_measured_s": case.min_measured_s,
        "run_iterations": case.measured_iterations,
        "warmup_iterations": case.warmup_iterations,
        "options": json.dumps(dict(case.options), sort_keys=True),
        "repeats": len(reals),
        "real_iteration_time_s": med,
        "real_iteration_time_min_s": min(times),
        "real_iteration_time_max_s": max(times),
        "real_iteration_times_s": _compact(times),
        "real_spread": spread,
        "sim_iteration_time_s": t_sim,
        "rel_err": rel,
        "abs_rel_err": abs(rel),
        "real_throughput_samples_s": float(median_run["global_batch_size"]) / med,
        "sim_throughput_samples_s": float(sim["throughput_samples_s"]),
        "real_comm_bytes_per_iteration": per_it_real[0],
        "sim_comm_bytes_per_iteration": per_it_sim,
        "bytes_by_link_over": "measured" if "measured_bytes_by_link" in sim else "run",
        "bytes_adjusted": str(median_run.get("bytes_adjusted", "")),
        "real_bytes_by_link": json.dumps(links_real[0]),
        "sim_bytes_by_link": json.dumps(links_sim),
        "bytes_exact": exact,
        "bytes_max_link_diff": int(diff),
        "real_utilization": _compact(median_run["per_gpu_utilization"]),
        "sim_utilization": _compact(sim["per_gpu_utilization"]),
        "real_bubble": float(median_run["bubble_fraction"]),
        "sim_bubble": float(sim["bubble_fraction"]),
        "real_bubble_per_rank": _compact([1 - u for u in median_run["per_gpu_utilization"]]),
        "sim_bubble_per_rank": _compact([1 - u for u in sim["per_gpu_utilization"]]),
        "real_send_hold_s": float(median_run.get("send_hold_s", 0.0)),
        "real_compute_s": _busy_s(real_for_why),
        "sim_compute_s": _busy_s(sim),
        "why": why_missed(rel, (min(times), max(times)), sim, real_for_why),
        "error": "",
    }


def _chrome(spans: Any, devices: Sequence[str], meta: Mapping[str, Any]) -> dict[str, Any]:
    from simcore.chrome import to_chrome_trace

    flat = {k: v for k, v in meta.items() if not isinstance(v, dict | list | tuple)}
    return to_chrome_trace(spans, list(devices), {"dtsim": flat})


def timeline_paths(out_dir: str, case_id: str) -> tuple[str, str, str]:
    """``(measured Chrome trace, simulated Chrome trace, side-by-side PNG)`` of a case."""
    base = os.path.join(out_dir, "timelines", case_id)
    return base + ".real.json", base + ".sim.json", base + ".png"


def run_case(
    case: Case,
    out_dir: str,
    topology_file: str,
    repeats: int,
    runner: RealRunner,
    ensemble: Ensemble = Ensemble(),
    registered: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Predict and run ``case``, write its two timelines, and return its row (each real
    run also simulated again on its own measurements as ``ensemble`` says: the replay);
    its measured iterations are planned (:meth:`Case.planned`) on the prediction.
    ``registered``: the case's entry of the registered predictions
    (:func:`register_predictions`), scored as written: its inputs must be the files it
    was made from."""
    from realrun.metrics import spans, summarize
    from traces.atomic import write_text

    prediction = predict_case(case, out_dir, topology_file)
    if registered is not None:
        check_registered(prediction, registered, out_dir)
    case, config, result, trace_file = (
        prediction.case,
        prediction.config,
        prediction.result,
        prediction.trace_file,
    )
    update = prediction.update
    sim = result.to_dict()
    job = make_job(case, config)
    records = runner(job, case.bandwidth_bytes_per_s, repeats)
    for k, rec in enumerate(records):
        keep_records(rec, records_path(out_dir, case, k))
    reals = [summarize(r, cluster="netns") for r in records]
    profiled_s = float(sim["iteration_time_s"])
    # each repeat is simulated again on the compute it measured (see the module docs)
    measured = [
        simulate_measured(case, rec, k, out_dir, topology_file, trace_file, update, job, ensemble)
        for k, rec in enumerate(records)
    ]
    if case.scheme == "gossip":
        reals = [without_shuffle_labels(r) for r in reals]
    # Links are compared over the measured iterations: a pipeline's simulation runs lead
    # and tail iterations the real run does not, and DDP lays its buckets out anew after
    # the first iteration (the warm-up's all-reduces split differently by a byte or two).
    # Gossip keeps whole-run totals, from which its shuffled labels are taken out.
    if case.scheme != "gossip" or result.simulated_iterations != (
        case.measured_iterations + case.warmup_iterations
    ):
        sim["measured_bytes_by_link"] = measured_links_sim(result)
        for real, rec in zip(reals, records, strict=True):
            real["measured_bytes_by_link"] = measured_links_real(rec)
    med = statistics.median(float(r["iteration_time_s"]) for r in reals)
    i = min(range(len(reals)), key=lambda k: abs(reals[k]["iteration_time_s"] - med))
    # the repeat's own compute: compare run k with its simulations, the median of both
    result = measured[i].result
    sim = dict(sim, iteration_time_s=statistics.median(m.iteration_time_s for m in measured))
    # the same samples in the predicted time (not the profile's prediction's throughput)
    sim["throughput_samples_s"] = float(sim["global_batch_size"]) / sim["iteration_time_s"]
    sim["per_gpu_utilization"] = result.per_gpu_utilization
    sim["bubble_fraction"] = result.bubble_fraction
    row = case_row(case, sim, reals)
    scored_s = float(registered["iteration_time_s"]) if registered else profiled_s
    row.update(prediction_columns(scored_s, row["real_iteration_time_s"]))
    row["prediction_source"] = (
        f"registered {registered['registered_at']}" if registered else "simulated at the run"
    )
    row["prediction_now_s"] = profiled_s  # today's simulation of the same inputs
    row["sim_profiled_iteration_time_s"] = scored_s
    row.update(calibration_columns(topology_file, case.bandwidth_bytes_per_s))
    row["sim_iteration_times_s"] = _compact([m.iteration_time_s for m in measured])
    every = [t for m in measured for t in m.times_s]
    row["sim_iteration_time_min_s"] = min(every)
    row["sim_iteration_time_max_s"] = max(every)
    row["sim_spread"] = (max(every) - min(every)) / row["sim_iteration_time_s"]
    row["sim_seeds"] = ensemble.runs
    row["sim_jitter"] = ensemble.jitter
    real_path, sim_path, _ = timeline_paths(out_dir, case.case_id)
    os.makedirs(os.path.dirname(real_path), exist_ok=True)
    real_meta = dict(reals[i], topology=f"measured, {case.bandwidth}")
    write_text(
        real_path, json.dumps(_chrome(spans(records[i]), reals[i]["device_names"], real_meta))
    )
    sim_meta = dict(sim, topology=f"simulated, {case.bandwidth}")
    write_text(sim_path, json.dumps(_chrome(result.spans, result.device_names, sim_meta)))
    return row


def simulate_measured(
    case: Case,
    records: Mapping[str, Any],
    repeat: int,
    out_dir: str,
    calibration: str,
    profile_trace: str,
    profile_update: Mapping[str, float],
    job: Any,
    ensemble: Ensemble = Ensemble(),
) -> Simulated:
    """Simulate ``case`` (as ``ensemble`` says) on the layer times, optimizer steps,
    messaging threads' CPU per message and sending threads' hold per ``isend`` that real
    run ``records`` measured (:func:`realrun.metrics.trace_from_run`, in CPU time;
    :func:`realrun.metrics.messenger_cpu_s_per_message`,
    :func:`realrun.metrics.isend_overhead_s`), a pipeline on the stages that run used
    (``scheme.stages``, checked against the run's plan); the trace and its preset are
    kept in ``traces/measured/`` of ``out_dir``."""
    from analysis.resolve import load_preset
    from realrun.metrics import (
        isend_overhead_s,
        messenger_cpu_s_per_message,
        posted_cpu_s_per_end,
        predict_overhead_s,
        server_step_overhead_s,
        trace_from_run,
        update_cost,
    )
    from simcore.schemes import get_scheme
    from simcore.schemes._pipeline import PREDICT_PASSES
    from traces.jsonfmt import load, save

    base = load(profile_trace.removesuffix(".json") + ".layers.json")
    trace = trace_from_run(records, base)
    path = os.path.join(out_dir, "traces", "measured", f"{case.case_id}-r{repeat}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save(trace, path)
    # fitted with the passes the simulator's step of this scheme makes
    passes = get_scheme(case.scheme).step_passes(job.optimizer, case.ranks)
    try:
        cost = update_cost(records, base, passes)
        update = {
            "memory_bandwidth_bytes_per_s": cost.bytes_per_s,
            "step_overhead_s": cost.overhead_s,
        }
    except ValueError:  # no update in the measured iterations: the profile's
        update = dict(profile_update)
    server_step = server_step_overhead_s(
        records, passes, float(update["memory_bandwidth_bytes_per_s"])
    )
    if server_step is not None:  # parameter servers step shard by shard
        update["step_overhead_s"] = server_step
    if job.pipeline and get_scheme(case.scheme).features.predict:  # SpecTrain
        update["predict_overhead_s"] = predict_overhead_s(
            records, base, PREDICT_PASSES, float(update["memory_bandwidth_bytes_per_s"])
        )
    host = load_preset(calibration).get("host") or {}
    per_byte = float(host.get("copy_cpu_s_per_byte", 0.0)) + float(
        host.get("p2p_copy_cpu_s_per_byte", 0.0)
    )
    p2p = messenger_cpu_s_per_message(records, per_byte, float(host.get("message_cpu_s", 0.0)))
    if p2p is not None:
        update["p2p_message_cpu_s"] = p2p
    isend = isend_overhead_s(
        records,
        base,
        float(host.get("message_cpu_s", 0.0)),
        float(host.get("copy_cpu_s_per_byte", 0.0)),
    )
    if isend is not None:
        update["isend_s"] = isend
    posted = posted_cpu_s_per_end(
        records, float(host.get("message_cpu_s", 0.0)), float(host.get("copy_cpu_s_per_byte", 0.0))
    )
    if posted is not None:
        update["posted_cpu_s"] = posted
    topology = case_topology(out_dir, calibration, path, update, source="run")
    if not job.pipeline:
        return simulate_ensemble(sim_config(case, path, topology), ensemble)
    layers = job.pipeline["stage_layers"]
    cuts = ",".join(base.layers[min(stage)].name for stage in layers[1:])
    pinned = replace(case, options=(*case.options, ("stages", cuts)))
    config = sim_config(pinned, path, topology)
    from realrun.pipeline import plan

    if plan(config)["stage_layers"] != layers:
        raise RuntimeError(f"the stages cut at {cuts} are not those the real run used ({layers})")
    write_text(stages_path(path), cuts)
    return simulate_ensemble(config, ensemble)


def stages_path(measured_trace: str) -> str:
    """Where a pipeline's measured repeat keeps the stage cuts it was simulated with
    (beside its trace; ``bench/resimulate.py`` reads them back)."""
    return measured_trace.removesuffix(".json") + ".stages"


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


def measured_files(case: Case, out_dir: str, repeat: int) -> tuple[str, str]:
    """``(trace, preset)``: the files :func:`simulate_measured` kept in
    ``traces/measured/`` of ``out_dir`` for repeat ``repeat`` of ``case``.
    ``FileNotFoundError`` when the repeat was not kept."""
    import glob

    base = os.path.join(out_dir, "traces", "measured", f"{case.case_id}-r{repeat}")
    presets = sorted(p for p in glob.glob(base + "-*.yaml") if not p.endswith(RESIMULATED))
    if not os.path.exists(base + ".json") or not presets:
        raise FileNotFoundError(f"no measured trace and preset of {case.case_id} repeat {repeat}")
    return base + ".json", presets[0]


def records_path(out_dir: str, case: Case, repeat: int) -> str:
    """Where the records of repeat ``repeat`` of ``case``'s real run are kept (gzipped
    JSON under ``real/`` of ``out_dir``): every span each rank recorded, so the measured
    trace can be built again (``bench/resimulate.py --rebuild``)."""
    return os.path.join(out_dir, "real", f"{case.case_id}-r{repeat}.json.gz")


def kept_repeats(out_dir: str, prefix: str = "") -> Iterator[tuple[Any, Case, int, str]]:
    """``(row, case, repeat, records file)`` for every repeat of the cases of the
    validation in ``out_dir`` that ran (status ``ok``) and whose id starts with
    ``prefix``: what the scripts that read kept runs again walk (``bench/``)."""
    import pandas as pd

    table = pd.read_parquet(table_path(out_dir))
    for _, row in table.iterrows():
        if row.status != "ok" or not row.point_id.startswith(prefix):
            continue
        case = case_from_row(row)
        for k in range(int(row.repeats)):
            yield row, case, k, records_path(out_dir, case, k)


def keep_records(records: Mapping[str, Any], path: str) -> None:
    """Write a real run's records to ``path`` (gzipped JSON, atomically)."""
    import gzip

    from traces.atomic import atomic_path

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp, gzip.open(tmp, "wt") as fh:
        json.dump(records, fh)


def load_records(path: str) -> dict[str, Any]:
    """The records :func:`keep_records` wrote."""
    import gzip

    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def remeasure(
    case: Case, out_dir: str, repeat: int, into: str, ensemble: Ensemble = Ensemble()
) -> Simulated:
    """Simulate repeat ``repeat`` of ``case`` again (as ``ensemble`` says) from its kept records
    (:func:`records_path`), reading them with this code: its measured trace and preset
    are built anew into ``traces/measured/`` of ``into`` (``out_dir``'s stay as they
    are), from the calibrated preset kept for the repeat and the job the run recorded.
    ``FileNotFoundError`` when the records or the preset were not kept."""
    from realrun.job import Job

    _trace, preset = measured_files(case, out_dir, repeat)
    records = load_records(records_path(out_dir, case, repeat))
    trace_file, update = ensure_trace(out_dir, case, preset)
    job = Job.from_dict(records["job"])
    return simulate_measured(case, records, repeat, into, preset, trace_file, update, job, ensemble)


RESIMULATED = "-resimulated.yaml"
"""Suffix of a measured repeat's preset written by :func:`measured_case_config`."""


def measured_case_config(
    case: Case, out_dir: str, repeat: int, preset: Mapping[str, Any] | None = None
) -> Any:
    """The configuration :func:`simulate_measured` simulated repeat ``repeat`` of
    ``case`` with, from what it kept (:func:`measured_files`, and a pipeline's stage
    cuts); ``preset``, when given, replaces the kept preset (written beside it, ending
    in :data:`RESIMULATED`). ``FileNotFoundError`` when the repeat was not kept (or a
    pipeline's cuts, which validations before 2026-11-24 did not keep)."""
    import yaml

    trace, topology = measured_files(case, out_dir, repeat)
    if preset is not None:
        topology = trace.removesuffix(".json") + RESIMULATED
        write_text(topology, yaml.safe_dump(dict(preset), sort_keys=False))
    from realrun.job import PIPELINE_SCHEMES

    if case.scheme in PIPELINE_SCHEMES:
        if not os.path.exists(stages_path(trace)):  # kept before the cuts were
            raise FileNotFoundError(f"no stage cuts kept for {case.case_id} repeat {repeat}")
        with open(stages_path(trace)) as fh:
            case = replace(case, options=(*case.options, ("stages", fh.read().strip())))
    return sim_config(case, trace, topology)


# ---- the whole validation ----------------------------------------------------------------


@dataclass(frozen=True)
class ValidationSummary:
    """What :func:`run_validation` did and found.

    Attributes:
        cases: cases in the matrix.
        skipped: cases the output already held (a resumed validation).
        computed: cases run now.
        failed: cases that raised (their rows hold the error).
        rows: the matrix's rows, in matrix order (finished ones).
        prediction_median_abs_rel_err: median |predicted - measured| / measured of
            iteration time, the prediction made before the runs (the headline).
        prediction_max_abs_rel_err: the largest of them.
        median_abs_rel_err: the same of the replay (each run simulated again on what it
            measured): a diagnostic, not a prediction.
        max_abs_rel_err: the largest of them.
        bytes_exact: cases whose bytes per link equal the simulator's.
        out_dir: where the outputs are.
    """

    cases: int
    skipped: int
    computed: int
    failed: int
    rows: tuple[Mapping[str, Any], ...]
    prediction_median_abs_rel_err: float
    prediction_max_abs_rel_err: float
    median_abs_rel_err: float
    max_abs_rel_err: float
    bytes_exact: int
    out_dir: str
    wall_s: float = 0.0
    errors: tuple[str, ...] = field(default=())


def table_path(out_dir: str) -> str:
    """The Parquet table (the store's output; a CSV copy is written beside it)."""
    return os.path.join(out_dir, "validation.parquet")


def summarise(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float, int]:
    """``(median |rel err|, max |rel err|, bytes-exact count)`` over the ``ok`` rows
    (``nan`` errors when there are none)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    errs = [abs(float(r["rel_err"])) for r in ok]
    if not errs:
        return math.nan, math.nan, 0
    return statistics.median(errs), max(errs), sum(bool(r["bytes_exact"]) for r in ok)


def summarise_prediction(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """``(median, max)`` of |prediction error| over the ``ok`` rows that have one
    (``nan`` when none has)."""
    errs = [
        abs(float(r["prediction_rel_err"]))
        for r in rows
        if r.get("status") == "ok" and _number(r.get("prediction_rel_err"))
    ]
    if not errs:
        return math.nan, math.nan
    return statistics.median(errs), max(errs)


def _number(v: Any) -> bool:
    try:
        return not math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def run_validation(
    cases: Sequence[Case],
    out_dir: str,
    *,
    repeats: int = REPEATS,
    calibrator: Calibrator = default_calibrator,
    topology_file: str | None = None,
    runner: RealRunner | None = None,
    progress: Callable[[Case, str], None] | None = None,
    command: str = "",
    ensemble: Ensemble = Ensemble(),
    calibrate_at: float | None = None,
) -> ValidationSummary:
    """Run every case of ``cases`` that ``out_dir`` does not hold yet (see module docs),
    appending each row as it finishes, then write the table and the report.

    ``topology_file``: use this preset for every bandwidth instead of calibrating (a
    calibrated one is moved to each case's link rate); ``calibrate_at``: calibrate once at
    this rate and move it to every case's (see :func:`prepare_calibrations`).
    Cases ``out_dir`` holds registered predictions of (:func:`register_predictions`) are
    scored against them as written; the others are predicted when they run.
    ``runner``: how a job runs for real (default :func:`netns_runner`).
    ``ensemble``: how each real run is simulated again (:class:`Ensemble`).
    ``progress(case, state)``: called with ``"start"``, ``"calibrate"`` (before a new
    calibration), ``"done"`` or ``"skip"``.
    A case that fails (a rank died, a plan that cannot run) is recorded with its error and
    the others go on; Ctrl-C stops at once, keeping every finished row.
    """
    from analysis.store import SweepStore
    from realrun.launch import RankFailed
    from simcore.engine import SimulationError

    if repeats < 1:
        raise ConfigError("repeats", repeats, "need at least one real run per case")
    t0 = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    runner = runner or netns_runner()
    skipped = computed = failed = 0
    errors: list[str] = []
    registered = (load_predictions(out_dir) or {}).get("cases", {})
    with SweepStore(table_path(out_dir)) as store:
        store.first = ("point_id", "status", "scheme", "model", "bandwidth", "ranks")
        todo = [c for c in cases if (store.rows.get(c.case_id) or {}).get("status") != "ok"]
        # a registered case is scored on the calibration it was predicted with
        calibrations = prepare_calibrations(
            [c for c in todo if c.case_id not in registered],
            out_dir,
            topology_file=topology_file,
            calibrate_at=calibrate_at,
            calibrator=calibrator,
            progress=progress,
        )
        for case in todo:
            entry = registered.get(case.case_id)
            if entry is not None:
                calibrations.setdefault(case.bandwidth_bytes_per_s, entry["calibration"])
        try:
            for case in cases:
                done = store.rows.get(case.case_id)
                if done is not None and done.get("status") == "ok":
                    skipped += 1
                    if progress:
                        progress(case, "skip")
                    continue
                if progress:
                    progress(case, "start")
                entry = registered.get(case.case_id)
                cal = entry["calibration"] if entry else calibrations[case.bandwidth_bytes_per_s]
                try:
                    row = run_case(case, out_dir, cal, repeats, runner, ensemble, registered=entry)
                except (RankFailed, SimulationError, ConfigError, ValueError) as exc:
                    message = " ".join(str(exc).split())
                    row = {
                        "point_id": case.case_id,
                        "status": "error",
                        "scheme": case.scheme,
                        "model": case.model,
                        "bandwidth": case.bandwidth,
                        "ranks": case.ranks,
                        "error": message,
                    }
                    failed += 1
                    errors.append(f"{case.describe()}: {message}")
                store.append(row)
                computed += 1
                if progress:
                    progress(case, "done")
        finally:
            store.save()
            _write_csv(store.rows.values(), out_dir)
        ids = {c.case_id for c in cases}
        rows = tuple(store.rows[c.case_id] for c in cases if c.case_id in store.rows)
        all_rows = list(store.rows.values())
    write_report(all_rows, out_dir, command=command, calibrations=_calibration_files(out_dir))
    mine = [r for r in rows if r["point_id"] in ids]
    med, worst, exact = summarise(mine)
    p_med, p_worst = summarise_prediction(mine)
    return ValidationSummary(
        cases=len(cases),
        skipped=skipped,
        computed=computed,
        failed=failed,
        rows=rows,
        prediction_median_abs_rel_err=p_med,
        prediction_max_abs_rel_err=p_worst,
        median_abs_rel_err=med,
        max_abs_rel_err=worst,
        bytes_exact=exact,
        out_dir=out_dir,
        wall_s=time.perf_counter() - t0,
        errors=tuple(errors),
    )


def _write_csv(rows: Any, out_dir: str) -> None:
    from analysis.store import rows_frame
    from traces.atomic import atomic_path

    rows = list(rows)
    if not rows:
        return
    df = rows_frame(rows, ("point_id", "status", "scheme", "model", "bandwidth", "ranks"))
    with atomic_path(os.path.join(out_dir, "validation.csv")) as tmp:
        df.to_csv(tmp, index=False)


def _calibration_files(out_dir: str) -> list[str]:
    d = os.path.join(out_dir, "calibration")
    if not os.path.isdir(d):
        return []
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".yaml"))


# ---- the report --------------------------------------------------------------------------


def scatter_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Predicted against measured iteration time, one point per case (error bars: the
    real runs' min to max), each case's replay beside it as a small cross, with y = x
    and the +-5 % and +-15 % bands."""
    from analysis.plots import _pyplot, _theme

    _theme()
    plt = _pyplot()
    ok = [r for r in rows if r.get("status") == "ok"]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    xs = [1e3 * float(r["real_iteration_time_s"]) for r in ok]
    ys = [1e3 * float(r["sim_iteration_time_s"]) for r in ok]
    ys += [1e3 * predicted_s(r) for r in ok if not math.isnan(predicted_s(r))]
    span = xs + ys
    span += [1e3 * float(r["real_iteration_time_min_s"]) for r in ok]
    span += [1e3 * float(r["real_iteration_time_max_s"]) for r in ok]
    span += [1e3 * v for r in ok for v in _sim_range_s(r) or ()]
    lo = min(span) * 0.8 if span else 1.0
    hi = max(span) * 1.2 if span else 10.0
    line = [lo, hi]
    ax.plot(line, line, color="black", linewidth=1, label="y = x")
    for band, alpha in ((0.15, 0.10), (0.05, 0.18)):
        ax.fill_between(
            line,
            [v * (1 - band) for v in line],
            [v * (1 + band) for v in line],
            color="tab:green",
            alpha=alpha,
            linewidth=0,
            label=f"±{int(band * 100)}%",
        )
    schemes = list(dict.fromkeys(r["scheme"] for r in ok))
    models = list(dict.fromkeys(r["model"] for r in ok))
    marker_of = {m: mk for m, mk in zip(models, ["o", "s", "^", "D", "v"] * 4, strict=False)}
    for s in schemes:
        for m in models:
            pts = [r for r in ok if r["scheme"] == s and r["model"] == m]
            if not pts:
                continue
            x = [1e3 * float(r["real_iteration_time_s"]) for r in pts]
            y = [1e3 * predicted_s(r) for r in pts]
            xerr = [
                [a - 1e3 * float(r["real_iteration_time_min_s"]) for a, r in zip(x, pts)],
                [1e3 * float(r["real_iteration_time_max_s"]) - a for a, r in zip(x, pts)],
            ]
            color = f"C{schemes.index(s) % 10}"
            ax.errorbar(
                x,
                y,
                xerr=xerr,
                fmt=marker_of[m],
                color=color,
                label=f"{s}, {m}",
                markersize=5,
                capsize=2,
            )
            replay = [1e3 * float(r["sim_iteration_time_s"]) for r in pts]
            ax.scatter(x, replay, marker="x", color=color, s=14, alpha=0.6, linewidths=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _pos: int) -> str:
        # minor ticks labelled at 2x, 3x and 5x a power of ten only: 6-9 crowd together
        leading = round(v / 10 ** math.floor(math.log10(v))) if v > 0 else 0
        return f"{v:g}" if leading in (1, 2, 3, 5) else ""

    plain = FuncFormatter(label)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="both", labelsize=8)
    ax.set_xlabel("measured iteration time (ms, median; bars: min to max)")
    ax.set_ylabel("predicted iteration time (ms; x: the replay)")
    ax.scatter([], [], marker="x", color="grey", label="replay (diagnostic)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title("sim validate: predicted against measured")
    return fig


def timeline_figure(real_trace: Mapping[str, Any], sim_trace: Mapping[str, Any], title: str) -> Any:
    """The measured and the simulated timeline of one case, one above the other, on the
    same time axis (two panels of :func:`analysis.plots.gantt_plot`)."""
    from analysis.plots import _pyplot, _theme, gantt_plot

    _theme()
    plt = _pyplot()

    def lanes(trace: Mapping[str, Any]) -> int:
        """Rows of the Gantt chart: one per device and stream (extra lanes merged)."""
        names = {
            (e["pid"], e["tid"]): str(e["args"]["name"]).split(" #")[0]
            for e in trace["traceEvents"]
            if e.get("ph") == "M" and e.get("name") == "thread_name"
        }
        return len(
            {
                (e.get("pid"), names.get((e.get("pid"), e.get("tid")), e.get("tid")))
                for e in trace["traceEvents"]
                if e.get("ph") == "X"
            }
        )

    n_real, n_sim = max(1, lanes(real_trace)), max(1, lanes(sim_trace))
    height = min(0.3 * (n_real + n_sim) + 2.5, 40.0)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, height), sharex=True, height_ratios=[n_real, n_sim]
    )
    gantt_plot(real_trace, ax=top, title=f"measured: {title}", xlabel="")
    gantt_plot(sim_trace, ax=bottom, title=f"simulated: {title}", xlabel="time (ms)")
    fig.tight_layout()
    return fig


def _iterations(row: Mapping[str, Any]) -> str:
    """A row's measured iterations per run (tables before 2026-11-25: ``iterations``)."""
    return str(case_from_row(row).measured_iterations)


def _fmt_ms(v: Any) -> str:
    return f"{1e3 * float(v):.1f}"


def _pct(v: Any) -> str:
    return f"{100 * float(v):+.1f}%"


def _sim_range_s(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """A row's fastest and slowest simulation, where it has them (rows of validations
    from before the ensemble do not)."""
    lo, hi = row.get("sim_iteration_time_min_s"), row.get("sim_iteration_time_max_s")
    if lo is None or hi is None or math.isnan(float(lo)) or math.isnan(float(hi)):
        return None
    return float(lo), float(hi)


def _sim_ms(row: Mapping[str, Any]) -> str:
    """A row's simulated time, with the range of its simulations where it has one."""
    text = _fmt_ms(row["sim_iteration_time_s"])
    rng = _sim_range_s(row)
    return text if rng is None else f"{text} ({_fmt_ms(rng[0])}-{_fmt_ms(rng[1])})"


def _ensemble_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """How the rows' simulated times were made (:class:`Ensemble`), in a sentence."""
    kinds = {
        (int(r["sim_seeds"]), float(r["sim_jitter"]))
        for r in rows
        if r.get("sim_seeds") is not None and not math.isnan(float(r["sim_seeds"]))
    }
    if len(kinds) != 1:
        return "Simulated is the median over the real runs of each one's simulation(s)."
    ((seeds, jitter),) = kinds
    if seeds == 1:
        return "Simulated is the median over the real runs of each one's simulation."
    return (
        f"Simulated is the median over the real runs of the mean of each one's {seeds} "
        f"simulations (each op's CPU work varied by a log-normal factor, coefficient of "
        f"variation {jitter:g}, one seed each); its range is over all of them."
    )


def write_report(
    rows: Sequence[Mapping[str, Any]],
    out_dir: str,
    *,
    command: str = "",
    calibrations: Sequence[str] = (),
    worst: int = 5,
) -> str:
    """Write ``report.md``, ``scatter.png`` and the cases' side-by-side timelines (those
    whose Chrome traces exist) into ``out_dir``; returns the report's path."""
    from analysis.plots import save_figure
    from analysis.report import md_table
    from traces.atomic import write_text

    rows = [dict(r) for r in rows]
    order = {s: i for i, s in enumerate(SCHEMES)}
    rows.sort(
        key=lambda r: (
            order.get(r["scheme"], 99),
            r["model"],
            r.get("bandwidth_bytes_per_s", 0),
            r["ranks"],
        )
    )
    ok = [r for r in rows if r.get("status") == "ok"]
    bad = [r for r in rows if r.get("status") != "ok"]
    med, mx, exact = summarise(rows)
    p_med, p_mx = summarise_prediction(rows)
    predicted = [r for r in ok if _number(r.get("prediction_rel_err"))]

    def within(key: str, band: float, among: Sequence[Mapping[str, Any]]) -> int:
        return sum(abs(float(r[key])) <= band for r in among)

    lines = ["# Validation: predicted against measured", ""]
    if command:
        lines += ["Produced by:", "", "```sh", command, "```", ""]
    sources = sorted({str(r.get("prediction_source") or "") for r in predicted} - {""})
    lines += [
        "## Summary",
        "",
        md_table(
            ["", "value"],
            [
                ["cases", str(len(rows))],
                ["cases run", str(len(ok))],
                ["cases failed", str(len(bad))],
                [
                    "**prediction**: median / max abs(rel err) of iteration time",
                    f"**{_pct_or_na(p_med)} / {_pct_or_na(p_mx)}**",
                ],
                [
                    "prediction within 5% / 15%",
                    f"{within('prediction_rel_err', HIT, predicted)} / "
                    f"{within('prediction_rel_err', 0.15, predicted)} of {len(predicted)}",
                ],
                ["predictions", "; ".join(sources) or "n/a"],
                [
                    "replay (diagnostic): median / max abs(rel err)",
                    f"{_pct_or_na(med)} / {_pct_or_na(mx)}",
                ],
                [
                    "replay within 5% / 15%",
                    f"{within('rel_err', HIT, ok)} / {within('rel_err', 0.15, ok)} of {len(ok)}",
                ],
                ["bytes per link exact", f"{exact} of {len(ok)}"],
                [
                    "median spread of the real runs",
                    f"{100 * statistics.median([float(r['real_spread']) for r in ok]):.1f}%"
                    if ok
                    else "n/a",
                ],
            ],
        ),
        "",
        "The **prediction** is the simulation made before a case's real runs, from the "
        "model's profile and the cluster's calibration only (registered in "
        f"`{PREDICTIONS}` before the runs where it says so; a pipeline case's profile is "
        "still taken in a loopback run of its own stages and micro-batches, not once per "
        "model). The **replay** simulates "
        "each real run again on what that run measured (its layer times, its messaging "
        "threads' CPU, its send holds): it separates a wrong input from a wrong model "
        "and is not a prediction. Relative error is (simulated - measured) / measured, "
        "measured being the median of the repeated real runs; spread is (max - min) / "
        "median over those runs, each run's time the mean of its measured iterations "
        "(the column iterations: enough for the run to measure its case's seconds at "
        "the predicted time). " + _ensemble_note(ok),
        "",
    ]
    if ok:
        fig = scatter_figure(ok)
        save_figure(fig, os.path.join(out_dir, "scatter.png"))
        lines += ["![simulated against measured](scatter.png)", ""]
        lines += ["## Worst predictions", ""]
        worst_rows = sorted(ok, key=lambda r: -abs(prediction_err(r)))[:worst]
        lines += [
            md_table(
                [
                    "case",
                    "measured ms",
                    "predicted ms",
                    "prediction error",
                    "replay error",
                    "spread",
                    "why (replay)",
                ],
                [
                    [
                        f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}",
                        _fmt_ms(r["real_iteration_time_s"]),
                        _fmt_ms(predicted_s(r)),
                        _pct(prediction_err(r)),
                        _pct(r["rel_err"]),
                        f"{100 * float(r['real_spread']):.1f}%",
                        r.get("why") or "hit",
                    ]
                    for r in worst_rows
                ],
            ),
            "",
        ]
        lines += ["## Every case", ""]
        lines += [
            md_table(
                [
                    "scheme",
                    "model",
                    "bandwidth",
                    "ranks",
                    "iterations",
                    "measured ms (min-max)",
                    "predicted ms",
                    "prediction error",
                    "replay ms (min-max)",
                    "replay error",
                    "spread",
                    "samples/s real / sim",
                    "bytes exact",
                    "util real / sim",
                    "bubble real / sim",
                ],
                [
                    [
                        r["scheme"],
                        r["model"],
                        r["bandwidth"],
                        str(r["ranks"]),
                        _iterations(r),
                        f"{_fmt_ms(r['real_iteration_time_s'])} "
                        f"({_fmt_ms(r['real_iteration_time_min_s'])}-"
                        f"{_fmt_ms(r['real_iteration_time_max_s'])})",
                        _fmt_ms(predicted_s(r)),
                        _pct(prediction_err(r)),
                        _sim_ms(r),
                        _pct(r["rel_err"]),
                        f"{100 * float(r['real_spread']):.1f}%",
                        f"{float(r['real_throughput_samples_s']):.0f} / "
                        f"{float(r['sim_throughput_samples_s']):.0f}",
                        "yes"
                        if _truthy(r["bytes_exact"])
                        else f"**no** ({r.get('bytes_max_link_diff', '?')} B off)",
                        f"{r['real_utilization']} / {r['sim_utilization']}",
                        f"{100 * float(r['real_bubble']):.0f}% / "
                        f"{100 * float(r['sim_bubble']):.0f}%",
                    ]
                    for r in ok
                ],
            ),
            "",
        ]
    if bad:
        lines += ["## Failed cases", ""]
        lines += [
            md_table(
                ["case", "error"],
                [
                    [
                        f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}",
                        r.get("error", ""),
                    ]
                    for r in bad
                ],
            ),
            "",
        ]
    used = {str(r["calibration"]) for r in ok if r.get("calibration")}
    given = [p for p in calibrations if os.path.abspath(p) not in used]
    every = [*sorted(used), *given]
    if every:
        lines += ["## Calibration", ""]
        for path in every:
            lines += [f"`{os.path.relpath(path, out_dir)}`:", ""]
            at = [r for r in ok if r.get("calibration") == path]
            if at:
                lines += [_calibration_use(at), ""]
            lines += [_calibration_summary(path), ""]
    shown = []
    for r in ok:
        real_p, sim_p, png = timeline_paths(out_dir, r["point_id"])
        if not (os.path.exists(real_p) and os.path.exists(sim_p)):
            continue
        if not os.path.exists(png):
            from analysis.plots import read_chrome_trace

            title = f"{r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']}"
            fig = timeline_figure(read_chrome_trace(real_p), read_chrome_trace(sim_p), title)
            save_figure(fig, png)
        shown.append((r, png, real_p, sim_p))
    if shown:
        lines += ["## Timelines, measured above simulated", ""]
        for r, png, real_p, sim_p in shown:
            rel = os.path.relpath(png, out_dir)
            lines += [
                f"### {r['scheme']} {r['model']} {r['bandwidth']} x{r['ranks']} "
                f"({_pct(r['rel_err'])})",
                "",
                f"![{r['point_id']}]({rel})",
                "",
                f"Chrome traces: `{os.path.relpath(real_p, out_dir)}`, "
                f"`{os.path.relpath(sim_p, out_dir)}`.",
                "",
            ]
    path = os.path.join(out_dir, "report.md")
    write_text(path, "\n".join(lines))
    return path


def predicted_s(row: Mapping[str, Any]) -> float:
    """A row's prediction (rows from before the prediction columns: the profile's)."""
    v = row.get("predicted_iteration_time_s")
    return float(v) if _number(v) else float(row.get("sim_profiled_iteration_time_s", math.nan))


def prediction_err(row: Mapping[str, Any]) -> float:
    v = row.get("prediction_rel_err")
    if _number(v):
        return float(v)
    measured = float(row["real_iteration_time_s"])
    return (predicted_s(row) - measured) / measured


def _calibration_use(rows: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: when the calibration was measured, its age at the cases' runs, and
    which cases used it at another link rate than it was measured at."""
    first = rows[0]
    ages = [float(r["calibration_age_h"]) for r in rows if _number(r.get("calibration_age_h"))]
    when = first.get("calibration_date") or "an unrecorded time"
    text = f"measured {when}"
    if first.get("calibration_rate"):
        text += f" at {first['calibration_rate']}"
    if ages:
        text += f"; {min(ages):.1f}-{max(ages):.1f} h old when its cases ran"
    moved = sorted({str(r["bandwidth"]) for r in rows if _truthy(r.get("calibration_moved"))})
    if moved:
        text += f"; moved to {', '.join(moved)} for the cases at those rates (the what-if)"
    return text + "."


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("true", "1", "yes")


def _calibration_summary(path: str) -> str:
    """The calibrated numbers that matter, as a small table."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        return f"(cannot be read: {exc})"
    rows: list[list[str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                if k in ("box", "name", "summary"):
                    continue
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif not isinstance(value, list):
            rows.append([prefix, str(value)])

    walk("", data)
    from analysis.report import md_table

    head = f"{data['summary']}\n\n" if isinstance(data.get("summary"), str) else ""
    return head + (md_table(["setting", "value"], rows) if rows else "(empty)")


def _pct_or_na(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.1f}%"


def format_summary(summary: ValidationSummary) -> str:
    """The command's closing lines: the numbers that decide the gate."""
    med = summary.median_abs_rel_err
    mx = summary.max_abs_rel_err
    ok = [r for r in summary.rows if r.get("status") == "ok"]
    lines = [
        f"{summary.cases} cases: {summary.computed} run now, {summary.skipped} already done, "
        f"{summary.failed} failed",
        f"prediction: median {_pct_or_na(summary.prediction_median_abs_rel_err)}, max "
        f"{_pct_or_na(summary.prediction_max_abs_rel_err)} | replay: median "
        f"{_pct_or_na(med)}, max {_pct_or_na(mx)}; bytes exact in {summary.bytes_exact} "
        f"of {len(ok)}",
        f"report: {os.path.join(summary.out_dir, 'report.md')}",
    ]
    return "\n".join(lines)


__all__ = [
    "BANDWIDTHS",
    "MODELS",
    "SCHEMES",
    "Case",
    "ValidationSummary",
    "build_matrix",
    "case_row",
    "format_summary",
    "quick_matrix",
    "run_validation",
    "summarise",
    "write_report",
]
