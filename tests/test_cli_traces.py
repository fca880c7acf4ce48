"""``sim profile`` and ``sim trace`` through click's CliRunner (``dtsim.cli.cli``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dtsim.cli import cli
from traces import load_builtin
from traces.catalog import load_file


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Error:")
    assert "Traceback" not in result.output
    for n in needles:
        assert n in lines[-1]


def test_trace_show_builtin() -> None:
    r = _run("trace", "show", "resnet50", "--top", "3")
    assert r.exit_code == 0, r.output
    assert "resnet50: batch 128" in r.output
    assert "biggest by time" in r.output and "biggest by parameters" in r.output
    assert "25,557,032" in r.output


def test_trace_show_json() -> None:
    r = _run("trace", "show", "vgg16", "--json")
    data = json.loads(r.output)
    assert data["param_count"] == 138_357_544 and data["meta"]["model"] == "vgg16"
    assert len(data["by_time"]) == 5


def test_trace_show_malformed_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "format": "dtsim-trace",
                "version": 1,
                "meta": {"model": "m", "device": "cpu", "batch_size": "two"},
                "layers": [],
            }
        )
    )
    _one_line_error(_run("trace", "show", str(bad)), str(bad), "meta.batch_size")


def test_trace_show_unknown_name() -> None:
    _one_line_error(_run("trace", "show", "no-such-model"), "no-such-model", "resnet50")


def test_convert_pipedream_to_dtsim(tmp_path: Path) -> None:
    from importlib import resources

    src = resources.files("traces.builtin").joinpath("pipedream/vgg16.txt")
    out = tmp_path / "vgg16.json"
    r = _run("trace", "convert", str(src), str(out), "--from", "pipedream")
    assert r.exit_code == 0, r.output
    converted = load_file(out)
    original = load_builtin("vgg16")
    assert [x.name for x in converted.layers] == [x.name for x in original.layers]
    assert converted.compute_s == pytest.approx(original.compute_s)
    assert converted.meta.batch_size == original.meta.batch_size


def test_convert_dtsim_to_dtsim_and_chrome(tmp_path: Path) -> None:
    out = tmp_path / "copy.json"
    assert _run("trace", "convert", "snn-analytic", str(out), "--model", "mine").exit_code == 0
    copy = load_file(out)
    assert copy.meta.model == "mine"
    assert copy.compute_s == pytest.approx(load_builtin("snn-analytic").compute_s)
    chrome = tmp_path / "chrome.json"
    assert _run("trace", "convert", str(out), str(chrome), "--to", "chrome").exit_code == 0
    events = [e for e in json.loads(chrome.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 2 * sum(1 for x in copy.layers if x.kind == "layer")
    assert events[-1]["cat"] == "backward"


def test_convert_pipedream_without_batch_size(tmp_path: Path) -> None:
    src = tmp_path / "graph.txt"
    src.write_text(
        "node1 -- Linear(4, 4) -- forward_compute_time=1.0, "
        "backward_compute_time=2.0, activation_size=16.0, parameter_size=80.0\n"
    )
    out = tmp_path / "o.json"
    _one_line_error(_run("trace", "convert", str(src), str(out)), str(src), "batch size")
    assert not out.exists()
    r = _run("trace", "convert", str(src), str(out), "--batch-size", "4")
    assert r.exit_code == 0 and load_file(out).meta.batch_size == 4


def test_convert_kineto(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from realrun.kineto import record_zoo_trace

    k = tmp_path / "k.json"
    record_zoo_trace("snn", 2, str(k), steps=1, warmup=0)
    out = tmp_path / "snn.json"
    r = _run("trace", "convert", str(k), str(out))
    assert r.exit_code == 0, r.output
    assert "kineto -> dtsim" in r.output
    assert load_file(out).param_count == load_builtin("snn-analytic").param_count


def test_profile_analytic_then_run(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "r18.json"
    r = _run(
        "profile",
        "--model",
        "resnet18",
        "--batch-size",
        "2",
        "--analytic",
        "--device-flops",
        "15.7TFLOPS",
        "--out",
        str(out),
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    assert load_file(out).meta.device == "analytic:1.57e+13"
    r = _run("run", "--model", str(out), "--gpus", "4", "--scheme", "dp", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gpus"] == 4


def test_profile_measured_small_model(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "snn.json"
    r = _run(
        "profile",
        "--model",
        "snn",
        "--batch-size",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--out",
        str(out),
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    trace = load_file(out)
    assert trace.meta.device == "cpu" and trace.meta.batch_size == 2
    assert all(x.forward_s > 0 for x in trace.layers if x.kind == "layer")


def test_profile_out_in_a_missing_folder(tmp_path: Path) -> None:
    out = tmp_path / "nope" / "x.json"
    _one_line_error(_run("profile", "--model", "snn", "--out", str(out)), "does not exist")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "resnet51"], "resnet51"),
        (["--model", "snn", "--analytic"], "--device-flops"),
        (["--model", "snn", "--analytic", "--device-flops", "fast"], "'fast'"),
        (["--model", "snn", "--device-flops", "1e12"], "--analytic"),
        (["--model", "snn", "--batch-size", "-1"], "--batch-size"),
        (
            [
                "--model",
                "snn",
                "--analytic",
                "--device-flops",
                "1e12",
                "--memory-bandwidth",
                "lots",
            ],
            "'lots'",
        ),
    ],
)
def test_profile_bad_input(tmp_path: Path, args: list[str], needle: str) -> None:
    out = tmp_path / "x.json"
    _one_line_error(_run("profile", *args, "--out", str(out), "--no-progress"), needle)
    assert not out.exists()


def test_profile_cuda_without_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "x.json"
    _one_line_error(
        _run("profile", "--model", "snn", "--device", "cuda", "--out", str(out), "--no-progress"),
        "no CUDA GPU",
    )
    assert not out.exists()
