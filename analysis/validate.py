"""Validation: the simulator's predictions against real runs of the same cases.

A validation is a *matrix* of cases (:mod:`analysis.validation.matrix`: scheme x model x
link bandwidth x ranks, plus batch size and iterations). :func:`run_validation` runs
every case its output folder does not hold yet, and for each case :func:`run_case`

1. **calibrates** the emulated cluster (:mod:`analysis.validation.inputs`,
   ``prepare_calibrations``): once per bandwidth, all of them before the first case,
   the host's wake-up wait fitted over all of them (``pool_calibrations``); or once at
   one rate (``calibrate_at``) that every case's rate is predicted from
   (:func:`realrun.calibrated.at_rate`: the what-if across link rates); or a given
   calibration file of any age. Kept as ``calibration/<bandwidth>.yaml``;
2. **profiles** the model on this machine once for every case of it (``ensure_trace``:
   the data-parallel runtime on one rank at two batch sizes, each layer's time a fixed
   part plus a part per sample, so other batches and micro-batches are predicted from
   it), kept as ``traces/...json``;
3. **predicts** the case (:mod:`analysis.validation.prediction`, ``predict_case``) from
   the profile and the calibration alone: the **prediction**, the number the validation
   is judged by. With ``sim validate --predict-only`` every case's prediction is written
   first, with the commit, the time and the inputs' hashes (``register_predictions``),
   and a later run of the same folder scores them as written;
4. **runs it for real** ``repeats`` times on an emulated cluster (network namespaces,
   links shaped to the bandwidth) with the very stages the simulation used (a pipeline's
   plan is made from the same configuration; :mod:`analysis.validation.harness`);
5. **replays** each run (:mod:`analysis.validation.replay`, ``simulate_measured``):
   simulates it again on what that run measured (its layers' spans, its messaging
   threads' CPU, its send holds), a few times each with a little compute jitter
   (``Ensemble``). The replay is a diagnostic, not a prediction: where the prediction
   misses and the replay does not, the inputs (profile, calibration) were wrong, not the
   model of the system;
6. appends one row (:mod:`analysis.validation.rows`, ``case_row``) to the store: measured
   iteration time (median, min, max and spread over the repeats), the predicted one and
   its error, the replay's and its error, throughput, bytes per link on both sides and
   whether they are equal, utilisation and bubble per rank, the calibration's age and
   rate, and ``why`` the replay misses.

Rows live in a :class:`analysis.store.SweepStore` (journal plus table), so an interrupted
validation loses no finished case and a rerun skips them. The report
(:mod:`analysis.validation.report`, ``write_report``) turns the rows into
``validation.parquet``/``.csv``, ``report.md``, a scatter of predicted (and replayed)
against measured time and per-case side-by-side timelines.

No click here; ``sim validate`` (:mod:`dtsim.cli.validate`) is the command line.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.matrix_defaults import REPEATS
from analysis.validation.harness import (
    RealRunner,
    keep_records,
    make_job,
    netns_runner,
    records_path,
    table_path,
)
from analysis.validation.inputs import (
    Calibrator,
    calibration_columns,
    calibration_files,
    default_calibrator,
    machine_probe_s,
    prepare_calibrations,
    profile_probe_s,
)
from analysis.validation.matrix import Case
from analysis.validation.prediction import check_registered, load_predictions, predict_case
from analysis.validation.replay import Ensemble, simulate_measured
from analysis.validation.report import pct_or_na, timeline_paths, write_report
from analysis.validation.rows import (
    case_row,
    compact,
    measured_links_real,
    measured_links_sim,
    prediction_columns,
    speed_columns,
    summarise,
    summarise_prediction,
    without_shuffle_labels,
)
from simcore.config import ConfigError


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


def _chrome(spans: Any, devices: Sequence[str], meta: Mapping[str, Any]) -> dict[str, Any]:
    from simcore.chrome import to_chrome_trace

    flat = {k: v for k, v in meta.items() if not isinstance(v, dict | list | tuple)}
    return to_chrome_trace(spans, list(devices), {"dtsim": flat})


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
    probes = [machine_probe_s()]  # the machine's speed beside the runs
    records = runner(job, case.bandwidth_bytes_per_s, repeats)
    probes.append(machine_probe_s())
    for k, rec in enumerate(records):
        keep_records(rec, records_path(out_dir, case, k))
    reals = [summarize(r, cluster="netns") for r in records]
    profiled_s = float(sim["iteration_time_s"])
    # each repeat is simulated again on the compute it measured (see the module docs)
    measured = [
        simulate_measured(case, rec, k, out_dir, topology_file, trace_file, update, job, ensemble)
        for k, rec in enumerate(records)
    ]
    reals = [without_shuffle_labels(r) for r in reals]  # gossip's shuffled labels
    # Links are compared over the measured iterations: a pipeline's simulation runs lead
    # and tail iterations the real run does not, and DDP lays its buckets out anew after
    # the first iteration (the warm-up's all-reduces split differently by a byte or two).
    # A run whose bytes were adjusted (gossip's, its shuffled labels taken out of the
    # whole-run totals) keeps whole-run totals where the simulation ran its iterations.
    adjusted = any("bytes_adjusted" in r for r in reals)
    if not adjusted or result.simulated_iterations != (
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
    row.update(speed_columns(profile_probe_s(trace_file), probes))
    row["sim_profiled_iteration_time_s"] = scored_s
    row.update(calibration_columns(topology_file, case.bandwidth_bytes_per_s))
    row["sim_iteration_times_s"] = compact([m.iteration_time_s for m in measured])
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
    # the timeline drawn is that repeat's replay (its own compute), not the prediction
    sim_meta = dict(sim, topology=f"replay of the run, {case.bandwidth}")
    write_text(sim_path, json.dumps(_chrome(result.spans, result.device_names, sim_meta)))
    return row


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
    write_report(all_rows, out_dir, command=command, calibrations=calibration_files(out_dir))
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


def format_summary(summary: ValidationSummary) -> str:
    """The command's closing lines: the numbers that decide the gate."""
    med = summary.median_abs_rel_err
    mx = summary.max_abs_rel_err
    ok = [r for r in summary.rows if r.get("status") == "ok"]
    lines = [
        f"{summary.cases} cases: {summary.computed} run now, {summary.skipped} already done, "
        f"{summary.failed} failed",
        f"prediction: median {pct_or_na(summary.prediction_median_abs_rel_err)}, max "
        f"{pct_or_na(summary.prediction_max_abs_rel_err)} | replay: median "
        f"{pct_or_na(med)}, max {pct_or_na(mx)}; bytes exact in {summary.bytes_exact} "
        f"of {len(ok)}",
        f"report: {os.path.join(summary.out_dir, 'report.md')}",
    ]
    return "\n".join(lines)
