"""The profiler: measured traces of a small model, analytic traces from FLOPs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from realrun.profiler import (  # noqa: E402
    ProfileConfig,
    ProfileError,
    profile_model,
    profile_module,
    time_training_step,
)

QUICK = {"warmup": 0, "repeats": 1, "min_sample_s": 0.0, "progress": False}


class Branchy(nn.Module):
    """conv -> (relu, conv) -> add -> flatten -> linear: a fork, a join and functional ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.side = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return self.fc(torch.flatten(self.relu(h) + self.side(h), 1))


def test_measured_trace_of_a_small_model() -> None:
    trace = profile_module(
        Branchy(), (torch.randn(4, 3, 8, 8),), ProfileConfig(batch_size=4, **QUICK), "branchy"
    )
    names = [layer.name for layer in trace.layers]
    assert names == ["x", "conv", "relu", "side", "add", "flatten", "fc"]
    edges = {(trace.layers[s].name, trace.layers[d].name) for s, d in trace.edges}
    assert {("conv", "relu"), ("conv", "side"), ("relu", "add"), ("side", "add")} <= edges
    by = {layer.name: layer for layer in trace.layers}
    assert by["x"].kind == "input" and by["x"].forward_s == 0
    assert all(by[n].forward_s > 0 for n in names[1:])
    # backward reaches every layer after the first parameterised one
    assert all(by[n].backward_s > 0 for n in ("conv", "relu", "side", "add", "fc"))
    assert by["conv"].param_bytes == (8 * 3 * 9 + 8) * 4
    assert by["conv"].activation_bytes == 4 * 8 * 8 * 8 * 4
    # FLOPs: 2 * MACs for the convolution, none for the element-wise add
    assert by["conv"].flops == 2 * 4 * 8 * 8 * 8 * 3 * 9
    assert by["add"].flops == 0
    m = trace.meta
    assert (m.model, m.device, m.batch_size, m.dtype) == ("branchy", "cpu", 4, "float32")
    assert m.framework == f"PyTorch {torch.__version__}"
    assert "isolated layer timing" in m.provenance and "median of 1" in m.provenance


def test_analytic_times_are_flops_over_rate() -> None:
    rate, eff = 1e12, 0.5
    trace = profile_model(
        "resnet18",
        ProfileConfig(
            batch_size=2, analytic=True, device_flops=rate, efficiency=eff, progress=False
        ),
    )
    by = {layer.name: layer for layer in trace.layers}
    conv = by["layer1.0.conv1"]
    assert conv.forward_s == pytest.approx(conv.flops / (rate * eff))
    # backward of a middle convolution: input gradient + weight gradient = 2x forward
    assert conv.backward_s == pytest.approx(2 * conv.forward_s)
    # the first convolution needs no input gradient: backward = 1x forward
    assert by["conv1"].backward_s == pytest.approx(by["conv1"].forward_s)
    # without a memory floor, element-wise layers cost nothing
    assert by["layer1.0.relu1"].forward_s == 0
    assert trace.meta.device == "analytic:1e+12"
    assert trace.param_count == 11_689_512
    assert "not a measurement" in trace.meta.provenance


def test_analytic_memory_floor_gives_elementwise_layers_a_time() -> None:
    trace = profile_model(
        "resnet18",
        ProfileConfig(
            batch_size=2, analytic=True, device_flops=1e12, memory_bytes_per_s=1e9, progress=False
        ),
    )
    relu = next(layer for layer in trace.layers if layer.name == "layer1.0.relu1")
    moved = 2 * relu.activation_bytes  # reads its input, writes its output
    assert relu.forward_s == pytest.approx(moved / 1e9)
    assert relu.backward_s == pytest.approx(2 * moved / 1e9)


def test_batch_size_scales_analytic_flops_linearly() -> None:
    cfg = {"analytic": True, "device_flops": 1e12, "progress": False}
    t1 = profile_model("snn", ProfileConfig(batch_size=4, **cfg))
    t2 = profile_model("snn", ProfileConfig(batch_size=8, **cfg))
    assert t2.compute_s == pytest.approx(2 * t1.compute_s)
    assert t1.rescale_batch(8).compute_s == pytest.approx(t2.compute_s)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="no CUDA GPU"):
        profile_model("snn", ProfileConfig(batch_size=2, device="cuda", progress=False))


@pytest.mark.parametrize(
    "bad",
    [
        {"batch_size": 0},
        {"dtype": "int8"},
        {"device": "tpu"},
        {"analytic": True},
        {"efficiency": 1.5},
        {"repeats": 0},
    ],
)
def test_bad_configs_are_refused(bad: dict) -> None:
    with pytest.raises(ProfileError):
        ProfileConfig(**{"batch_size": 2, **bad})


def test_whole_step_time_is_positive_and_leaves_no_gradients_behind() -> None:
    model = Branchy()
    t = time_training_step(model, (torch.randn(2, 3, 8, 8),), warmup=0, repeats=1)
    assert t > 0
    assert model.conv.weight.grad is not None
