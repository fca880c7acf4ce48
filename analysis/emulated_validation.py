"""``sim validate --device emulated``: predictions registered first, then real runs on
emulated devices (:mod:`realrun.emudevice`) on the emulated cluster, and the score.

Protocol (docs/validation.md, "Emulated devices"):

1. every case is resolved once (its emulated model's reference, byte scale included,
   and the link rate its run is shaped to) and predicted by
   :func:`analysis.emulated.predict` on one calibration; the predictions, the commit,
   the time and the calibration's SHA-256 are written to ``predictions.json`` before
   any real run, and never rewritten (a folder with predictions scores those);
2. each case runs ``repeats`` times on network namespaces shaped to its rate; a row
   keeps every repeat's emulated-cluster time, their median and spread, the machine's
   CPU share and flag, the bytes per iteration against the simulator's;
3. the score counts cases whose runs were not flagged for CPU: the median and the
   largest absolute error of the registered prediction, and how many moved exactly
   the simulator's bytes.

Rows are appended to ``rows.jsonl`` as cases finish, so a rerun of the same command
skips finished cases; ``results.csv`` and ``summary.json`` are written at the end.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.emulated import model_ref, predict
from simcore.config import ConfigError
from simcore.schemes import get_scheme
from simcore.units import parse_rate
from traces.emulated import load_run_trace, parse_ref

CALIBRATION_RATE = "100Mbps"
"""Where ``sim validate --device emulated`` calibrates when given no calibration: about
the rate its runs' links are shaped to (the cluster's rate / dilation x byte scale)."""

FAIL_ABOVE = 0.05
"""The median absolute prediction error above which the validation fails."""

FAIL_ABOVE_MAX = 0.10
"""The largest absolute prediction error above which it fails."""


@dataclass(frozen=True)
class EmuCase:
    """One emulated case.

    Attributes:
        scheme: the scheme (``sim schemes``).
        trace: the layer trace (a built-in name or a file).
        gpus: workers (``ps``/``p3`` add as many servers; a pipeline's ranks).
        bandwidth: the emulated cluster's link rate, as text (``10Gbps``).
        dilation: compute x this, links / this.
        options: scheme options as ``(key, value)`` pairs.
        batch_size: samples per worker (0: the trace's own).
        iterations: measured iterations (after one warm-up).
    """

    scheme: str
    trace: str
    gpus: int
    bandwidth: str
    dilation: float = 10.0
    options: tuple[tuple[str, Any], ...] = ()
    batch_size: int = 0
    iterations: int = 3

    @property
    def case_id(self) -> str:
        """A name for files and tables."""
        opts = "".join(f"-{k}={v}" for k, v in self.options)
        return f"{self.scheme}-{self.trace}-{self.gpus}r-{self.bandwidth}-k{self.dilation:g}{opts}"

    def describe(self) -> str:
        """A short description for progress bars."""
        return f"{self.scheme} {self.trace} x{self.gpus} {self.bandwidth}"

    @property
    def rate_bytes_per_s(self) -> float:
        """The emulated cluster's link rate."""
        return parse_rate(self.bandwidth)

    @property
    def servers(self) -> int:
        """Parameter-server ranks (as many as workers for ``ps`` and ``p3``:
        :func:`realrun.job.server_ranks`)."""
        from realrun.job import server_ranks

        return server_ranks(self.scheme, dict(self.options), self.gpus)


def _cases(*rows: tuple[Any, ...]) -> tuple[EmuCase, ...]:
    return tuple(EmuCase(*row) for row in rows)


SEED_MATRIX = _cases(
    # data parallel: the P3 and GossipGraD papers' models at their bandwidths
    ("dp", "resnet50", 4, "10Gbps"),
    ("dp", "resnet50", 16, "10Gbps"),
    ("dp", "vgg16", 8, "10Gbps"),
    ("dp", "gnmt", 8, "25Gbps"),
    ("dp", "inception_v3", 16, "25Gbps"),
    ("dp", "alexnet", 8, "10Gbps", 20.0),
    ("ps", "resnet50", 8, "10Gbps", 50.0),
    ("ps", "vgg16", 4, "25Gbps", 50.0),
    ("p3", "resnet50", 16, "10Gbps", 50.0),
    ("p3", "vgg16", 8, "10Gbps", 50.0),
    ("p3", "resnet50", 4, "1Gbps", 50.0),
    ("p3", "alexnet", 8, "10Gbps", 50.0),
    ("gossip", "resnet50", 8, "10Gbps"),
    ("gossip", "resnet50", 16, "10Gbps"),
    ("gossip", "vgg16", 4, "10Gbps"),
    # pipelines: PipeDream's and GPipe's models, 4 and 8 stages
    ("mp", "gnmt", 4, "10Gbps", 50.0),
    ("mp", "vgg16", 4, "10Gbps"),
    ("gpipe", "resnet50", 4, "10Gbps"),
    ("gpipe", "gnmt", 8, "10Gbps", 50.0),
    ("pipedream", "vgg16", 4, "10Gbps", 10.0, (), 96),
    ("pipedream", "gnmt", 8, "25Gbps", 50.0, (("microbatches", 8),)),
    ("pipedream", "resnet50", 8, "10Gbps", 10.0, (), 120),
    ("spectrain", "vgg16", 4, "10Gbps"),
    ("spectrain", "gnmt", 8, "10Gbps", 50.0),
    ("zb-h1", "resnet50", 4, "10Gbps"),
)
"""The seed papers' workloads (PipeDream's V100 profiles at their batch sizes), all
eight schemes (and ZB-H1), 4 to 16 ranks, 1 to 25 Gbit/s. PipeDream's own micro-batch
count (a multiple of its input stage's replicas) need not divide the papers' batch, and a
real micro-batch needs whole samples: its VGG-16 and ResNet-50 cases take batches of 96
and 120 (6 and 15 micro-batches), its GNMT case 8 micro-batches. GNMT's pipelines pass
micro-batches of milliseconds, and the parameter servers send a message per key or
slice (P3: one per 50,000 parameters, each about 0.5 ms of CPU on the shared cores), so
these run dilated 50 times (AlexNet's `dp` 20), to keep the hosts' work small beside the
compute it stands for."""

QUICK_MATRIX = _cases(
    ("dp", "resnet18", 4, "10Gbps", 10.0, (), 64, 2),
    ("p3", "resnet18", 4, "10Gbps", 50.0, (), 64, 2),
    ("gossip", "resnet18", 4, "10Gbps", 10.0, (), 64, 2),
    ("gpipe", "resnet18", 4, "10Gbps", 10.0, (), 64, 2),
)
"""Four cases of a few seconds each: one per scheme family."""

WHAT_IF_DILATION = {"p3": 50.0}
"""The what-if matrices' dilation by scheme (10 otherwise; see :data:`SEED_MATRIX`)."""

HOST_WORK_GROWS = ("p3", "gpipe")
"""Schemes whose host work per iteration grows with the ranks at a fixed iteration time:
P3's slice messages (one per slice, key and worker), GPipe's stage boundaries (one
message per micro-batch and boundary each way)."""

SCALING_BASE_RANKS = 8
"""Beyond this many ranks, :func:`scaling_dilation` grows the dilation with the ranks."""


def scaling_dilation(scheme: str, ranks: int) -> float:
    """The cluster-size what-if's dilation: the scheme's (:data:`WHAT_IF_DILATION`, 10
    otherwise), times ``ranks / 8`` beyond 8 ranks for :data:`HOST_WORK_GROWS`, so that
    their host work per second of the run stays that of 8 ranks. The first sweep
    (2026-11-28/29, one dilation for all ranks) measured those two schemes' machines 43%
    and 54% busy at 8 ranks and 72% and 80% at 16, where P3's two runs differed by 10%."""
    k = WHAT_IF_DILATION.get(scheme, 10.0)
    if scheme in HOST_WORK_GROWS and ranks > SCALING_BASE_RANKS:
        k *= ranks / SCALING_BASE_RANKS
    return k


SCALING_MATRIX = tuple(
    EmuCase(scheme, "resnet50", n, "10Gbps", scaling_dilation(scheme, n), iterations=2)
    for scheme in ("dp", "p3", "gossip", "gpipe")
    for n in (2, 4, 8, 16)
)
"""The cluster-size what-if: ResNet-50 at 10 Gbit/s on 2 to 16 ranks
(:func:`scaling_dilation`)."""

BANDWIDTH_MATRIX = tuple(
    EmuCase(scheme, "resnet50", 8, bw, WHAT_IF_DILATION.get(scheme, 10.0), iterations=2)
    for scheme in ("dp", "p3", "gossip", "gpipe")
    for bw in ("1Gbps", "5Gbps", "10Gbps", "25Gbps")
)
"""The bandwidth what-if: ResNet-50 on 8 ranks at 1 to 25 Gbit/s."""

UNSEEN_MATRIX = _cases(
    ("dp", "inception_v3", 8, "10Gbps"),
    ("dp", "vgg16", 4, "25Gbps"),
    ("ps", "resnet50", 4, "25Gbps", 50.0),
    ("gossip", "gnmt", 8, "25Gbps"),
    ("gossip", "alexnet", 4, "10Gbps", 20.0),
    ("mp", "resnet50", 4, "10Gbps"),
    ("gpipe", "vgg16", 8, "10Gbps"),
    ("pipedream", "alexnet", 4, "10Gbps", 20.0, (), 132),
    ("spectrain", "resnet50", 4, "10Gbps"),
    ("zb-h1", "vgg16", 4, "10Gbps"),
)
"""Ten cases of the seed papers' workloads that no model change was made on, written down
(2026-11-29) before any of them was predicted or run: other model, scheme, rank and
bandwidth combinations than the seed matrix's, every scheme family."""

UNSEEN2_MATRIX = _cases(
    ("dp", "inception_v3", 4, "10Gbps"),
    ("dp", "resnet50", 16, "25Gbps"),
    ("dp", "vgg16", 16, "25Gbps"),
    ("dp", "gnmt", 4, "10Gbps"),
    ("dp", "alexnet", 4, "25Gbps", 20.0),
    ("ps", "inception_v3", 4, "10Gbps", 50.0),
    ("ps", "resnet50", 8, "25Gbps", 50.0),
    ("p3", "inception_v3", 8, "10Gbps", 50.0),
    ("p3", "vgg16", 4, "25Gbps", 50.0),
    ("gossip", "inception_v3", 8, "10Gbps"),
    ("gossip", "resnet50", 4, "25Gbps"),
    ("gossip", "vgg16", 8, "25Gbps"),
    ("gossip", "inception_v3", 16, "25Gbps"),
    ("mp", "vgg16", 8, "10Gbps"),
    ("mp", "inception_v3", 4, "10Gbps"),
    ("gpipe", "inception_v3", 4, "10Gbps"),
    ("gpipe", "vgg16", 4, "25Gbps"),
    ("gpipe", "gnmt", 4, "10Gbps", 50.0),
    ("pipedream", "vgg16", 8, "10Gbps", 10.0, (), 98),
    ("pipedream", "inception_v3", 4, "10Gbps", 10.0, (), 132),
    ("spectrain", "vgg16", 8, "10Gbps"),
    ("spectrain", "alexnet", 4, "10Gbps", 20.0),
    ("zb-h1", "gnmt", 4, "10Gbps", 50.0),
    ("zb-h1", "resnet50", 8, "10Gbps"),
)
"""Twenty-four more cases of the seed papers' workloads, none in another matrix, written
down (2026-11-29) with the model frozen after concurrent flows' spread was added, before
any was predicted or run: all eight schemes and ZB-H1, 4 to 16 ranks, 10 and 25 Gbit/s,
Inception-v3 in every family."""

SCHEDULE_NAMES = (
    "1f1b",
    "zb-h1",
    "interleaved",
    "looped-bfs",
    "zb-interleaved",
    "zbv",
    "dualpipev",
)
"""The pipeline schedules of :data:`SCHEDULES_MATRIX`: synchronous 1F1B and the five
schedules of ``torch.distributed.pipelining`` with the zero-bubble paper's ZB-H1."""

SCHEDULES_MATRIX = tuple(
    EmuCase(scheme, trace, 4, bw, k)
    for trace, bw, k in (("vgg16", "25Gbps", 10.0), ("resnet50", "25Gbps", 10.0),
                         ("gnmt", "25Gbps", 50.0))
    for scheme in SCHEDULE_NAMES
)  # fmt: skip
"""Today's pipeline schedules on 4 emulated devices: every schedule of
:data:`SCHEDULE_NAMES` on VGG-16, ResNet-50 and GNMT at 25 Gbit/s (GNMT dilated 50 times, its
passes being short), automatic micro-batches, two chunks per rank where a schedule has
chunks; no case is in another matrix. Written down (2026-12-01) before any was predicted
or run; the zero-bubble paper's comparison (``sim report --emulated``) reads it."""

MATRICES: dict[str, tuple[EmuCase, ...]] = {
    "seed": SEED_MATRIX,
    "unseen": UNSEEN_MATRIX,
    "unseen2": UNSEEN2_MATRIX,
    "schedules": SCHEDULES_MATRIX,
    "quick": QUICK_MATRIX,
    "scaling": SCALING_MATRIX,
    "bandwidth": BANDWIDTH_MATRIX,
}
"""``sim validate --device emulated --matrix NAME``."""


# ---- predictions ---------------------------------------------------------------------------


def predictions_path(out_dir: str) -> str:
    """Where the registered predictions of ``out_dir`` are."""
    return os.path.join(out_dir, "predictions.json")


def resolve(case: EmuCase, memory_bytes: int | None = None) -> str:
    """The emulated model reference of ``case`` (``ConfigError`` when it cannot run)."""
    return model_ref(
        case.trace,
        batch_size=case.batch_size or None,
        dilation=case.dilation,
        byte_scale=None,
        ranks=case.gpus + case.servers,
        hosts=case.gpus,
        cluster_rate_bytes_per_s=case.rate_bytes_per_s,
        memory_bytes=memory_bytes,
    )


def predict_case(case: EmuCase, ref: str, calibration: str) -> Any:
    """:func:`analysis.emulated.predict` of ``case`` run with emulated model ``ref``;
    ``ConfigError`` naming the case if a pipeline's plan cannot run for real (a batch
    that its micro-batches do not divide), so no such prediction is registered."""
    p = predict(
        ref,
        case.scheme,
        case.gpus,
        dict(case.options),
        calibration,
        case.rate_bytes_per_s,
        iterations=case.iterations,
    )
    if get_scheme(case.scheme).pipeline:
        from realrun.job import JobError, pipeline_of

        try:
            pipeline_of(p.config)
        except ValueError as exc:
            why = exc.text if isinstance(exc, JobError) else str(exc)
            raise ConfigError("case", case.case_id, f"cannot run for real: {why}") from None
    return p


def register(
    cases: Sequence[EmuCase],
    out_dir: str,
    calibration: str,
    *,
    command: str = "",
    progress: Callable[[EmuCase, str], None] | None = None,
) -> dict[str, Any]:
    """Predict every case and write ``predictions.json`` (see module docs); a folder
    that has one gets it back unchanged, with the cases it lacks refused
    (``ConfigError``)."""
    from analysis.validation.prediction import sha256_file, source_commit
    from traces.atomic import write_text

    path = predictions_path(out_dir)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        missing = [c.case_id for c in cases if c.case_id not in data["cases"]]
        if missing:
            raise ConfigError(
                "out",
                out_dir,
                f"its registered predictions ({path}) lack {missing[0]}; they are never "
                "rewritten: give another --out",
            )
        return data
    commit, dirty = source_commit()
    entries: dict[str, Any] = {}
    for case in cases:
        if progress:
            progress(case, "predict")
        ref = resolve(case)
        p = predict_case(case, ref, calibration)
        entries[case.case_id] = {
            "case": case_fields(case),
            "model_ref": ref,
            "run_rate_bytes_per_s": p.link_rate_bytes_per_s,
            "predicted_iteration_time_s": p.iteration_time_s,
            "predicted_run_iteration_time_s": p.run_iteration_time_s,
            "predicted_comm_bytes_per_iteration": float(p.result.comm_bytes_per_iteration),
            "predicted_utilization": float(p.result.gpu_utilization),
            "predicted_seed_iteration_times_s": list(p.seed_times_s),
        }
    data = {
        "registered_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "command": command,
        "calibration": os.path.abspath(calibration) if os.path.exists(calibration) else calibration,
        "calibration_sha256": sha256_file(calibration) if os.path.exists(calibration) else "",
        "cases": entries,
    }
    os.makedirs(out_dir, exist_ok=True)
    write_text(path, json.dumps(data, indent=1) + "\n")
    return data


def case_fields(case: EmuCase) -> dict[str, Any]:
    """``case`` as plain values."""
    return {
        "scheme": case.scheme,
        "trace": case.trace,
        "gpus": case.gpus,
        "bandwidth": case.bandwidth,
        "dilation": case.dilation,
        "options": json.dumps(dict(case.options), sort_keys=True),
        "batch_size": case.batch_size,
        "iterations": case.iterations,
    }


# ---- real runs -----------------------------------------------------------------------------


Runner = Callable[[Any, float | None, int], list[dict[str, Any]]]
"""``runner(job, run_rate_bytes_per_s, repeats) -> [records of each repeat]``."""


def job_for(case: EmuCase, entry: Mapping[str, Any], calibration: str) -> Any:
    """The real run of a registered case (its registered model reference and the
    simulated configuration's pipeline plan)."""
    from analysis.validation.harness import make_job
    from analysis.validation.matrix import Case

    ref = str(entry["model_ref"])
    p = predict_case(case, ref, calibration)
    vcase = Case(
        case.scheme,
        ref,
        float(entry["run_rate_bytes_per_s"] or 0.0),
        case.gpus,
        batch_size=parse_ref(ref).batch_size,
        iterations=case.iterations,
        options=case.options,
    )
    return make_job(vcase, p.config, timeout_s=300.0)


def score_case(
    case: EmuCase, entry: Mapping[str, Any], results: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The row of a case from its repeats' summarised results (see module docs)."""
    from analysis.validation.rows import without_shuffle_labels

    times = [float(r["emulated_iteration_time_s"]) for r in results]
    med = statistics.median(times)
    predicted = float(entry["predicted_iteration_time_s"])
    busy = [r.get("machine_cpu_busy_share") for r in results]
    flagged = any(bool(r.get("cpu_flagged")) for r in results)
    real_bytes = [float(without_shuffle_labels(r)["comm_bytes_per_iteration"]) for r in results]
    sim_bytes = float(entry["predicted_comm_bytes_per_iteration"])
    rel = (predicted - med) / med if med > 0 else math.inf
    spec = parse_ref(str(entry["model_ref"]))
    device_s = load_run_trace(str(entry["model_ref"])).compute_s / spec.dilation
    pipeline = get_scheme(case.scheme).pipeline  # the others: a batch per worker
    samples = spec.batch_size * (1 if pipeline else case.gpus)
    speedup = samples / spec.batch_size * device_s  # over one device: x / iteration time
    return {
        "case_id": case.case_id,
        **case_fields(case),
        "status": "flagged" if flagged else "ok",
        "model_ref": entry["model_ref"],
        "repeats": len(results),
        "real_iteration_time_s": med,
        "real_iteration_times_s": json.dumps([round(t, 6) for t in times]),
        "real_spread": (max(times) - min(times)) / med if med > 0 else math.inf,
        "predicted_iteration_time_s": predicted,
        "predicted_seed_spread": _seed_spread(entry.get("predicted_seed_iteration_times_s")),
        "prediction_rel_err": rel,
        "abs_prediction_rel_err": abs(rel),
        "real_utilization": statistics.fmean(float(r["gpu_utilization"]) for r in results),
        "predicted_utilization": float(entry.get("predicted_utilization", math.nan)),
        "real_comm_bytes_per_iteration": real_bytes[0],
        "sim_comm_bytes_per_iteration": sim_bytes,
        "bytes_exact": all(b == sim_bytes for b in real_bytes),
        "machine_cpu_busy_share": max((b for b in busy if b is not None), default=math.nan),
        "cpu_flagged": flagged,
        "byte_scale": spec.byte_scale,
        "run_rate_bytes_per_s": entry["run_rate_bytes_per_s"],
        "samples_per_iteration": samples,
        "device_compute_s": device_s,
        "real_speedup": speedup / med,
        "predicted_speedup": speedup / predicted,
        "real_scaling_efficiency": speedup / med / case.gpus,
        "predicted_scaling_efficiency": speedup / predicted / case.gpus,
    }


def netns_runner() -> Runner:
    """Runs a job on an emulated cluster shaped to the run's rate
    (:func:`analysis.validation.harness.netns_runner`)."""
    from analysis.validation.harness import netns_runner as runner

    return runner()


def rows_path(out_dir: str) -> str:
    """Where finished cases' rows are appended."""
    return os.path.join(out_dir, "rows.jsonl")


def load_rows(out_dir: str) -> dict[str, dict[str, Any]]:
    """The rows already in ``out_dir`` (a torn last line is ignored)."""
    path = rows_path(out_dir)
    rows: dict[str, dict[str, Any]] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                rows[row["case_id"]] = row
    return rows


def run_cases(
    cases: Sequence[EmuCase],
    out_dir: str,
    predictions: Mapping[str, Any],
    calibration: str,
    *,
    repeats: int = 2,
    runner: Runner | None = None,
    progress: Callable[[EmuCase, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every case not yet in ``out_dir`` ``repeats`` times and score it against its
    registered prediction; returns every case's row, in ``cases`` order."""
    from realrun.metrics import summarize

    run = runner or netns_runner()
    done = load_rows(out_dir)
    for case in cases:
        if case.case_id in done:
            continue
        entry = predictions["cases"][case.case_id]
        if progress:
            progress(case, "run")
        try:
            job = job_for(case, entry, calibration)
            records = run(job, entry["run_rate_bytes_per_s"], repeats)
            results = [summarize(r, cluster="netns") for r in records]
            row = score_case(case, entry, results)
        except Exception as exc:  # one failed case is a row, the rest still run
            row = {"case_id": case.case_id, **case_fields(case), "status": "failed"}
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        with open(rows_path(out_dir), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        done[case.case_id] = row
    return [done[c.case_id] for c in cases if c.case_id in done]


# ---- the score ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """The validation's outcome over the counted (not flagged) cases."""

    counted: int
    flagged: int
    failed: int
    median_abs_err: float
    max_abs_err: float
    bytes_exact: int
    cases: int

    def line(self) -> str:
        """One line for people."""
        return (
            f"emulated devices: prediction median {100 * self.median_abs_err:.1f}%, max "
            f"{100 * self.max_abs_err:.1f}% over {self.counted} of {self.cases} cases "
            f"({self.flagged} flagged for CPU, {self.failed} failed); bytes exact in "
            f"{self.bytes_exact} of {self.counted + self.flagged}"
        )


def score(rows: Sequence[Mapping[str, Any]]) -> Score:
    """The :class:`Score` of ``rows``."""
    ok = [r for r in rows if r.get("status") == "ok"]
    ran = [r for r in rows if r.get("status") in ("ok", "flagged")]
    errs = [float(r["abs_prediction_rel_err"]) for r in ok]
    return Score(
        counted=len(ok),
        flagged=sum(1 for r in rows if r.get("status") == "flagged"),
        failed=sum(1 for r in rows if r.get("status") == "failed"),
        median_abs_err=statistics.median(errs) if errs else math.nan,
        max_abs_err=max(errs) if errs else math.nan,
        bytes_exact=sum(1 for r in ran if r.get("bytes_exact")),
        cases=len(rows),
    )


def write_results(rows: Sequence[Mapping[str, Any]], out_dir: str, s: Score) -> None:
    """``results.csv`` (a row per case) and ``summary.json``."""
    from traces.atomic import write_text

    keys: list[str] = []
    for r in rows:
        keys.extend(k for k in r if k not in keys)
    path = os.path.join(out_dir, "results.csv")
    tmp = path + ".part"
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    os.replace(tmp, path)
    summary = {k: getattr(s, k) for k in Score.__dataclass_fields__}
    summary["line"] = s.line()
    write_text(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=1) + "\n")


def _seed_spread(times: Any) -> float:
    """(max - min) / median of a prediction's per-seed times (0 for one seed or none):
    how much the drawn link rates alone move it."""
    if not times or len(times) < 2:
        return 0.0
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med > 0 else math.inf
