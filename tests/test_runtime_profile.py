"""One profile per model, taken inside the data-parallel runtime on the machine's shared cores
(realrun.runtime_profile): what ``sim profile --in-runtime`` writes, the optimizer step it
carries into a calibrated preset, and ``sim validate`` predicting every case of a model
from that one profile."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from traces.errors import TraceFormatError
from traces.jsonfmt import from_dict, load, save, to_dict
from traces.model import Layer, TraceMeta, chain

CALIBRATED = os.path.join(os.path.dirname(__file__), "data", "calibrated-1Gbps.yaml")


def _trace(step_bytes_per_s: float = 0.0, step_overhead_s: float = 0.0) -> Any:
    meta = TraceMeta(
        "m", "cpu", 8, step_bytes_per_s=step_bytes_per_s, step_overhead_s=step_overhead_s
    )
    return chain(meta, [Layer("a", 1e-3, 2e-3, param_bytes=4_000_000, activation_bytes=800)])


def _run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from dtsim.cli import main

    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return ex.value.code, out, err


def test_the_measured_step_survives_the_file_format_and_old_files_load_without_it() -> None:
    back = from_dict(to_dict(_trace(2.5e9, 3e-4)))
    assert (back.meta.step_bytes_per_s, back.meta.step_overhead_s) == (2.5e9, 3e-4)
    plain = to_dict(_trace())
    assert "step_bytes_per_s" not in plain["meta"]  # written only when measured
    assert from_dict(plain).meta.step_bytes_per_s == 0.0
    bad = to_dict(_trace(2.5e9))
    bad["meta"]["step_bytes_per_s"] = -1
    with pytest.raises(TraceFormatError, match="step_bytes_per_s"):
        from_dict(bad)


def test_a_calibrated_preset_takes_the_profiles_step_and_others_keep_theirs() -> None:
    from analysis.resolve import load_preset
    from realrun.calibrated import with_profiled_step
    from simcore.topology import parse_sections

    preset = load_preset(CALIBRATED)
    meta = _trace(2.5e9, 3e-4).meta
    moved = with_profiled_step(preset, meta)
    gpu = parse_sections(moved).gpu
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.5e9, rel=1e-3)
    assert gpu.step_overhead_s == pytest.approx(3e-4, rel=1e-3)
    assert moved["measured"]["sources"]["gpu.memory_bandwidth_bytes_per_s"] == "profile"
    # a preset whose step came from a profile already (a validation's case preset) keeps
    # it; a trace that measured no step and a GPU preset change nothing
    again = with_profiled_step(moved, _trace(9e9, 0.0).meta)
    assert parse_sections(again).gpu.memory_bandwidth_bytes_per_s == pytest.approx(2.5e9, 1e-3)
    assert with_profiled_step(preset, _trace().meta) is preset
    v100 = load_preset("dgx1")
    assert with_profiled_step(v100, meta) is v100


def test_sim_run_predicts_the_step_the_profile_measured(tmp_path: Path) -> None:
    """The user's flow: a trace from ``sim profile --in-runtime`` on a calibrated preset
    is simulated with the step measured with it; a slower step, a longer iteration."""
    from analysis.resolve import build_config
    from simcore.engine import simulate
    from simcore.spec import RunSpec

    times = []
    for rate in (20e9, 0.5e9):
        path = tmp_path / f"m-{rate:g}.json"
        save(_trace(rate, 1e-4), str(path))
        spec = RunSpec().replace(
            scheme="dp", gpus=2, model=str(path), topology=CALIBRATED, batch_size=8
        )
        config = build_config(spec, record_spans=False)
        gpu = config.topology.sections.gpu
        assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(rate, rel=1e-3)
        times.append(simulate(config).iteration_time_s)
    assert times[1] > times[0]


def test_profile_in_runtime_refuses_what_it_cannot_measure() -> None:
    from realrun.runtime_profile import default_batches, profile_in_runtime

    assert default_batches(24) == (6, 24)
    assert default_batches(3) == (3,)
    with pytest.raises(ValueError, match="batch sizes"):
        profile_in_runtime("mlp_small", [], structure=_trace())
    with pytest.raises(ValueError, match="batch sizes"):
        profile_in_runtime("mlp_small", [0, 8], structure=_trace())
    with pytest.raises(ValueError, match="repeats"):
        profile_in_runtime("mlp_small", [8], structure=_trace(), repeats=0)
    with pytest.raises(ValueError, match="ranks"):
        profile_in_runtime("mlp_small", [8], structure=_trace(), ranks=0)


def test_sim_profile_in_runtime_measures_real_training_steps(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """``sim profile --in-runtime`` on a real one-rank data-parallel run (gloo on
    loopback) at the batch and a quarter of it: fixed parts fitted, the optimizer step
    measured and kept, every layer with weights timed."""
    pytest.importorskip("torch", reason="sim profile measures with torch (pip install .[real])")
    path = tmp_path / "m.json"
    args = ["profile", "--model", "mlp_small", "--batch-size", "16", "--no-progress"]
    code, out, err = _run_main(capsys, *args, "--in-runtime", "--repeats", "1", "--out", str(path))
    assert code == 0, err
    trace = load(str(path))
    assert trace.meta.batch_size == 16
    assert "inside the data-parallel runtime" in trace.meta.provenance
    assert "batches 4, 16" in trace.meta.provenance
    assert trace.meta.step_bytes_per_s > 0 and "optimizer step" in out
    weighted = [layer for layer in trace.layers if layer.param_bytes > 0]
    assert weighted and all(layer.forward_s > 0 and layer.backward_s > 0 for layer in weighted)
    for layer in trace.layers:
        assert 0 <= layer.forward_fixed_s <= layer.forward_s
        assert 0 <= layer.backward_fixed_s <= layer.backward_s


def test_sim_profile_in_runtime_on_two_ranks_takes_their_mean(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """``--ranks 2``: two data-parallel ranks on loopback, each at the batch; the trace
    is at the per-rank batch and says how many ranks it was measured on."""
    pytest.importorskip("torch", reason="sim profile measures with torch (pip install .[real])")
    path = tmp_path / "m.json"
    args = ["profile", "--model", "mlp_small", "--batch-size", "16", "--no-progress"]
    code, _, err = _run_main(
        capsys, *args, "--in-runtime", "--ranks", "2", "--repeats", "1", "--out", str(path)
    )
    assert code == 0, err
    trace = load(str(path))
    assert trace.meta.batch_size == 16 and "on 2 ranks" in trace.meta.provenance
    assert all(layer.forward_s > 0 for layer in trace.layers if layer.param_bytes > 0)
    other = tmp_path / "n.json"
    code, _, err = _run_main(capsys, *args, "--ranks", "2", "--out", str(other))
    assert code == 2 and "--ranks" in err and "--in-runtime" in err and not other.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--analytic", "--device-flops", "1e12"), "--in-runtime"),
        (("--device", "cuda"), "--in-runtime"),
        (("--format", "chakra"), "--in-runtime"),
    ],
)
def test_sim_profile_in_runtime_refuses_other_methods_in_one_line(
    capsys: pytest.CaptureFixture, tmp_path: Path, extra: tuple[str, ...], words: str
) -> None:
    path = tmp_path / "m.json"
    args = ["profile", "--model", "mlp_small", "--in-runtime", "--out", str(path), *extra]
    code, _, err = _run_main(capsys, *args)
    assert code == 2 and words in err and "Traceback" not in err
    assert not path.exists()


def test_a_validation_profiles_each_model_once_for_all_its_cases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case of a model (data-parallel, a pipeline at its micro-batch, another batch
    size) is predicted from one profile taken at the declared batches; a second model
    gets its own."""
    from analysis.validation import inputs
    from analysis.validation.matrix import Case
    from realrun import profiler, runtime_profile
    from realrun.metrics import UpdateCost

    calls: list[tuple[str, tuple[int, ...]]] = []

    def fake_structure(model: str, config: Any, shape: Any = None) -> Any:
        return replace(_trace(), meta=replace(_trace().meta, model=model, batch_size=24))

    def fake_profile(model: str, batches: Any, **kw: Any) -> Any:
        calls.append((model, tuple(batches)))
        return runtime_profile.RuntimeProfile(
            kw["structure"], UpdateCost(1e9, 2e-4), tuple(batches), 3
        )

    monkeypatch.setattr(profiler, "profile_model", fake_structure)
    monkeypatch.setattr(runtime_profile, "profile_in_runtime", fake_profile)
    cases = [
        Case("dp", "mlp_medium", 125e6, 2),
        Case("gpipe", "mlp_medium", 125e6, 2, options=(("microbatches", 4),)),
        Case("pipedream", "mlp_medium", 25e6, 3, batch_size=36, options=(("microbatches", 3),)),
        Case("dp", "cnn_medium", 125e6, 2),
    ]
    got = [inputs.ensure_trace(str(tmp_path), c) for c in cases]
    assert calls == [
        ("mlp_medium", inputs.PROFILE_BATCHES),
        ("cnn_medium", inputs.PROFILE_BATCHES),
    ]
    assert got[0][0] == got[1][0] == got[2][0] != got[3][0]
    assert got[0][1] == {"memory_bandwidth_bytes_per_s": 1e9, "step_overhead_s": 2e-4}
    assert json.loads(Path(got[0][0].removesuffix(".json") + ".update.json").read_text())
    assert Path(got[0][0].removesuffix(".json") + ".layers.json").exists()
    # the machine's compute probe, taken with each profile, for the cases to compare with
    probe = inputs.profile_probe_s(got[0][0])
    assert probe is not None and 0 < probe < 1
    assert inputs.profile_probe_s(str(tmp_path / "nowhere.json")) is None


def test_the_compute_probe_times_one_thread_and_restores_the_callers_threads() -> None:
    torch = pytest.importorskip("torch", reason="the probe computes with torch")
    from realrun.runtime_profile import compute_probe_s

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        probe = compute_probe_s(calls=3)
        assert 0 < probe < 1  # about 10 ms on this machine's cores
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_speed_columns_compare_the_cases_probes_with_the_profiles() -> None:
    import math

    from analysis.validation.rows import speed_columns

    cols = speed_columns(0.010, [0.012, 0.014])
    assert cols["machine_probe_s"] == pytest.approx(0.013)
    assert cols["machine_vs_profile"] == pytest.approx(1.3)  # the case ran 1.3x slower
    assert cols == pytest.approx(speed_columns(0.010, [None, 0.013]))
    assert math.isnan(speed_columns(None, [0.01])["machine_vs_profile"])
    assert math.isnan(speed_columns(0.01, [None, None])["machine_vs_profile"])


def test_the_report_names_the_cases_whose_machine_moved() -> None:
    from analysis.validation.report import _machine_speed

    rows = [
        {"point_id": "a", "machine_vs_profile": 1.02},
        {"point_id": "b", "machine_vs_profile": 1.40},
        {"point_id": "c", "machine_vs_profile": float("nan")},
        {"point_id": "d"},
    ]
    text = _machine_speed(rows)
    assert "1.21x" in text and "1.02-1.40x" in text  # median and range of a and b
    assert "b 1.40x" in text and "a 1.02x" not in text
    assert _machine_speed([{"point_id": "d"}]) == ""
