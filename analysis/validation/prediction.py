"""The prediction: what the simulator says of a case before any of its real runs.

:func:`predict_case` simulates a case from its model's profile and the cluster's
calibration alone (:class:`Prediction`), and plans its measured iterations on the
predicted time. :func:`register_predictions` writes every case's prediction, with the
commit, the time and the SHA-256 of every input, to ``predictions.json`` before any
real run (``sim validate --predict-only``); a later validation of the folder loads them
(:func:`load_predictions`) and scores them as written, refusing one whose inputs
changed (:func:`check_registered`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.validation.harness import sim_config
from analysis.validation.inputs import calibration_columns, case_topology, ensure_trace
from analysis.validation.matrix import Case
from simcore.config import ConfigError
from traces.atomic import write_text


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

    trace_file, update = ensure_trace(out_dir, case)
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


def sha256_file(path: str) -> str:
    """The SHA-256 of a file's bytes (hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


PREDICTIONS = "predictions.json"
"""The registered predictions' file in a validation's output folder."""


def predictions_path(out_dir: str) -> str:
    """Where :func:`register_predictions` writes (and the scoring reads) the predictions."""
    return os.path.join(out_dir, PREDICTIONS)


def source_commit() -> tuple[str | None, bool]:
    """``(commit, dirty)`` of the git checkout dtsim runs from; ``(None, False)`` when it
    is not one (an installed package) or git is missing."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
