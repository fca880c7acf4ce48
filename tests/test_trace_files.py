"""Trace files: malformed files get one clear error naming file and field; the built-in
catalogue's zoo traces load and say where they come from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces import builtin_models, load_builtin, load_trace
from traces.catalog import load_file
from traces.errors import TraceFormatError
from traces.jsonfmt import save, to_dict


def _good() -> dict:
    return {
        "format": "dtsim-trace",
        "version": 1,
        "meta": {"model": "m", "device": "cpu", "batch_size": 2},
        "layers": [
            {"name": "a", "forward_s": 1e-3, "backward_s": 2e-3},
            {"name": "b", "forward_s": 1e-3, "backward_s": 2e-3},
        ],
        "edges": [["a", "b"]],
    }


@pytest.mark.parametrize(
    "mutate, field, problem",
    [
        (lambda d: d.update(format="other"), "format", "expected 'dtsim-trace'"),
        (lambda d: d.update(version=9), "version", "unsupported version"),
        (lambda d: d["meta"].pop("batch_size"), "meta.batch_size", "missing"),
        (lambda d: d["meta"].update(batch_size=0), "meta.batch_size", "integer >= 1"),
        (lambda d: d["layers"][1].update(forward_s=-1), "layers[1].forward_s", "non-negative"),
        (lambda d: d["layers"][1].update(name="a"), "layers[1].name", "duplicate"),
        (lambda d: d["edges"].append(["b", "zz"]), "edges[1]", "unknown layer name 'zz'"),
        (lambda d: d["edges"].append(["b", "a"]), "edges", "cycle"),
    ],
)
def test_malformed_dtsim_files(tmp_path: Path, mutate, field: str, problem: str) -> None:
    doc = _good()
    mutate(doc)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as info:
        load_trace(str(path))
    assert (info.value.field, info.value.source) == (field, str(path))
    assert problem in info.value.problem


def test_not_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"format": "dtsim-trace",\n "version": }')
    with pytest.raises(TraceFormatError, match=r"not valid JSON \(line 2, column"):
        load_file(path)


def test_kineto_files_are_recognised_by_content(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(TraceFormatError, match="no 'layer::<layer>'"):
        load_file(path)


def test_round_trip_through_the_dtsim_format(tmp_path: Path) -> None:
    original = load_builtin("resnet18")
    save(original, tmp_path / "r.json")
    again = load_file(tmp_path / "r.json")
    assert to_dict(again)["layers"] == to_dict(original)["layers"]
    assert again.edges == original.edges


ZOO_BUILTINS = sorted(n for n, e in builtin_models().items() if e.file.startswith("zoo/"))


def test_zoo_builtins_exist_for_cpu_and_analytic() -> None:
    assert any(n.endswith("-cpu") for n in ZOO_BUILTINS)
    for seed in (
        "vgg16",
        "resnet50",
        "resnet152",
        "inception_v3",
        "transformer",
        "residual_lstm",
        "snn",
    ):
        assert f"{seed}-analytic" in ZOO_BUILTINS


@pytest.mark.parametrize("name", ZOO_BUILTINS)
def test_zoo_builtin_loads_with_provenance(name: str) -> None:
    entry = builtin_models()[name]
    trace = load_builtin(name)
    assert trace.meta.batch_size == entry.batch_size
    assert trace.meta.framework.startswith("PyTorch 2.")
    assert trace.meta.date
    if name.endswith("-analytic"):
        assert trace.meta.device.startswith("analytic:")
        assert "not a measurement" in trace.meta.provenance
    else:
        assert "isolated layer timing" in trace.meta.provenance
    # how it was made: the script for CPU and analytic traces, the sim command run on the
    # lent GPU for GPU traces
    prov = trace.meta.provenance
    assert "make_builtin_traces.py" in prov or ("'sim " in prov and "NVIDIA" in prov)
    assert trace.compute_s > 0 and trace.param_bytes > 0
