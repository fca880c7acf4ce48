"""The replay: each real run simulated again on what that run measured.

:func:`simulate_measured` rebuilds a run's trace and preset from its records (its
layers' spans, its optimizer steps, its messaging threads' CPU, its send holds; a
pipeline on the stages that run used) and simulates it a few times with a little
compute jitter (:class:`Ensemble`, :func:`simulate_ensemble`). The replay is a
diagnostic, not a prediction: where the prediction misses and the replay does not, the
inputs were wrong, not the model of the system. :func:`remeasure` and
:func:`measured_case_config` simulate kept repeats again (``bench/``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from analysis.matrix_defaults import SIM_JITTER, SIM_SEEDS
from analysis.validation.harness import load_records, records_path, sim_config
from analysis.validation.inputs import case_topology, ensure_trace
from analysis.validation.matrix import Case
from simcore.config import ConfigError
from traces.atomic import write_text


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
    from realrun.job import pipeline_of

    if pipeline_of(config)["stage_layers"] != layers:
        raise RuntimeError(f"the stages cut at {cuts} are not those the real run used ({layers})")
    write_text(stages_path(path), cuts)
    return simulate_ensemble(config, ensemble)


def stages_path(measured_trace: str) -> str:
    """Where a pipeline's measured repeat keeps the stage cuts it was simulated with
    (beside its trace; ``bench/resimulate.py`` reads them back)."""
    return measured_trace.removesuffix(".json") + ".stages"


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
    from simcore.schemes import get_scheme

    if get_scheme(case.scheme).pipeline:
        if not os.path.exists(stages_path(trace)):  # kept before the cuts were
            raise FileNotFoundError(f"no stage cuts kept for {case.case_id} repeat {repeat}")
        with open(stages_path(trace)) as fh:
            case = replace(case, options=(*case.options, ("stages", fh.read().strip())))
    return sim_config(case, trace, topology)


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
    trace_file, update = ensure_trace(out_dir, case)
    job = Job.from_dict(records["job"])
    return simulate_measured(case, records, repeat, into, preset, trace_file, update, job, ensemble)
