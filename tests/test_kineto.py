"""Kineto (PyTorch profiler) traces: a recorded trace imports to the profiler's layers,
GPU kernels are charged to the layer that launched them, malformed files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces.errors import TraceFormatError
from traces.kineto import RANGE_PREFIX, from_dict, load


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from realrun.kineto import record_zoo_trace

    path = tmp_path_factory.mktemp("kineto") / "resnet18.json"
    record_zoo_trace("resnet18", 1, str(path), steps=2, warmup=1)
    return path


def test_recorded_trace_imports_to_the_profilers_layers(recorded: Path) -> None:
    from realrun.profiler import ProfileConfig, profile_model

    imported = load(recorded)
    profiled = profile_model(
        "resnet18", ProfileConfig(batch_size=1, analytic=True, device_flops=1e12, progress=False)
    )
    assert [layer.name for layer in imported.layers] == [layer.name for layer in profiled.layers]
    assert imported.edges == profiled.edges
    for a, b in zip(imported.layers, profiled.layers):
        assert (a.kind, a.op, a.param_bytes, a.activation_bytes) == (
            b.kind,
            b.op,
            b.param_bytes,
            b.activation_bytes,
        )
    running = [layer for layer in imported.layers if layer.kind == "layer"]
    assert all(layer.forward_s > 0 for layer in running)
    convs = [layer for layer in running if layer.op.startswith("Conv2d")]
    assert all(layer.backward_s > 0 for layer in convs)
    m = imported.meta
    assert (m.model, m.device, m.batch_size, m.source_format) == ("resnet18", "cpu", 1, "kineto")
    assert "2 profiled step(s)" in m.provenance


def _event(name: str, ts: float, dur: float, cat: str = "cpu_op", **args: object) -> dict:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": dict(args),
    }


def _graph_meta() -> dict:
    return {
        "model": "tiny",
        "batch_size": 4,
        "layers": [
            {"name": "x", "kind": "input"},
            {"name": "fc1", "param_bytes": 80},
            {"name": "fc2", "param_bytes": 40},
        ],
        "edges": [["x", "fc1"], ["fc1", "fc2"]],
    }


def test_cpu_attribution_by_sequence_number() -> None:
    ev = [
        _event(RANGE_PREFIX + "fc1", 0, 10, "user_annotation"),
        _event("aten::linear", 1, 8, **{"Sequence number": 7}),
        _event(RANGE_PREFIX + "fc2", 20, 6, "user_annotation"),
        _event("aten::linear", 21, 4, **{"Sequence number": 8}),
        _event("aten::sum", 30, 1, **{"Sequence number": 9}),
        _event(
            "autograd::engine::evaluate_function: SumBackward0", 40, 2, **{"Sequence number": 9}
        ),
        _event(
            "autograd::engine::evaluate_function: AddmmBackward0", 50, 12, **{"Sequence number": 8}
        ),
        _event("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 62, 3),
        _event(
            "autograd::engine::evaluate_function: AddmmBackward0", 70, 20, **{"Sequence number": 7}
        ),
    ]
    trace = from_dict({"traceEvents": ev, "dtsim": _graph_meta()})
    by = {layer.name: layer for layer in trace.layers}
    assert by["fc1"].forward_s == pytest.approx(10e-6)
    assert by["fc2"].forward_s == pytest.approx(6e-6)
    assert by["fc2"].backward_s == pytest.approx(15e-6)  # its function + AccumulateGrad
    assert by["fc1"].backward_s == pytest.approx(20e-6)
    assert by["x"].forward_s == 0 and by["fc1"].param_bytes == 80
    assert "0.002 ms of backward work" in trace.meta.provenance


def test_gpu_kernels_are_charged_to_the_launching_layer() -> None:
    ev = [
        _event(RANGE_PREFIX + "fc1", 0, 10, "user_annotation"),
        _event("aten::addmm", 1, 8, **{"Sequence number": 1}),
        _event("cudaLaunchKernel", 2, 1, "cuda_runtime", correlation=100),
        _event(RANGE_PREFIX + "fc2", 20, 6, "user_annotation"),
        _event("aten::addmm", 21, 4, **{"Sequence number": 2}),
        _event("cudaLaunchKernel", 22, 1, "cuda_runtime", correlation=101),
        _event(
            "autograd::engine::evaluate_function: AddmmBackward0", 50, 12, **{"Sequence number": 2}
        ),
        _event("cudaLaunchKernel", 51, 1, "cuda_runtime", correlation=102),
        _event(
            "autograd::engine::evaluate_function: AddmmBackward0", 70, 20, **{"Sequence number": 1}
        ),
        _event("cudaLaunchKernel", 71, 1, "cuda_runtime", correlation=103),
        _event("cudaLaunchKernel", 72, 1, "cuda_runtime", correlation=104),
    ]
    kernels = [(100, 300), (101, 200), (102, 400), (103, 500), (104, 50)]
    for corr, dur in kernels:
        ev.append(
            {
                "ph": "X",
                "name": "gemm",
                "cat": "kernel",
                "pid": 0,
                "tid": 7,
                "ts": 1000 + corr,
                "dur": dur,
                "args": {"correlation": corr},
            }
        )
    meta = {**_graph_meta(), "device": "NVIDIA H100"}
    trace = from_dict({"traceEvents": ev, "dtsim": meta})
    by = {layer.name: layer for layer in trace.layers}
    assert by["fc1"].forward_s == pytest.approx(300e-6)
    assert by["fc2"].forward_s == pytest.approx(200e-6)
    assert by["fc2"].backward_s == pytest.approx(400e-6)
    assert by["fc1"].backward_s == pytest.approx(550e-6)
    assert trace.meta.device == "NVIDIA H100"
    assert "GPU kernel durations" in trace.meta.provenance


def test_trace_without_metadata_is_a_chain_and_needs_a_batch_size() -> None:
    ev = [
        _event(RANGE_PREFIX + "a", 0, 5, "user_annotation"),
        _event(RANGE_PREFIX + "b", 10, 5, "user_annotation"),
    ]
    with pytest.raises(TraceFormatError, match="batch size"):
        from_dict({"traceEvents": ev}, source="p.json")
    trace = from_dict({"traceEvents": ev}, source="p.json", batch_size=3)
    assert [layer.name for layer in trace.layers] == ["a", "b"]
    assert trace.edges == ((0, 1),) and trace.meta.batch_size == 3


@pytest.mark.parametrize(
    "doc, field, problem",
    [
        ({"events": []}, "traceEvents", "not a PyTorch profiler"),
        ({"traceEvents": {}}, "traceEvents", "expected a list"),
        (
            {"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": -1}]},
            "traceEvents[0].dur",
            "non-negative",
        ),
        (
            {"traceEvents": [{"ph": "X", "name": 5, "ts": 0, "dur": 1}]},
            "traceEvents[0].name",
            "string",
        ),
        ({"traceEvents": []}, "traceEvents", "no 'layer::<layer>'"),
        (
            {
                "traceEvents": [_event(RANGE_PREFIX + "zz", 0, 1, "user_annotation")],
                "dtsim": _graph_meta(),
            },
            "dtsim.layers",
            "names no layer",
        ),
        (
            {
                "traceEvents": [_event(RANGE_PREFIX + "fc1", 0, 1, "user_annotation")],
                "dtsim": {**_graph_meta(), "batch_size": 0},
            },
            "dtsim.batch_size",
            "positive integer",
        ),
        (
            {
                "traceEvents": [_event(RANGE_PREFIX + "fc1", 0, 1, "user_annotation")],
                "dtsim": _graph_meta(),
            },
            "dtsim.layers[2]",
            "no 'layer::fc2' range",
        ),
        (
            {
                "traceEvents": [_event(RANGE_PREFIX + "fc1", 0, 1, "user_annotation")],
                "dtsim": {**_graph_meta(), "edges": [["x", "nope"]]},
            },
            "dtsim.edges[0]",
            "pair",
        ),
    ],
)
def test_malformed_kineto_files_name_the_field(
    tmp_path: Path, doc: dict, field: str, problem: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as info:
        load(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(path) in str(info.value)
