"""The model zoo: every model's parameter count equals the published one (torchvision's
for the vision models) or, for our own definitions, the closed form in its docstring."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realrun import zoo  # noqa: E402


def _lstm(inp: int, hidden: int) -> int:
    return 4 * hidden * (inp + hidden) + 8 * hidden


def _linear(inp: int, out: int) -> int:
    return inp * out + out


PUBLISHED = {
    "alexnet": 61_100_840,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "squeezenet1_0": 1_248_424,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "googlenet": 6_624_904,
    "inception_v3": 27_161_264,
    "densenet121": 7_978_856,
    # BERT-base (109,482,240 up to the pooler) plus a 768 -> 2 classifier
    "transformer": 109_482_240 + _linear(768, 2),
    "residual_lstm": 10000 * 1024 + 4 * _lstm(1024, 1024) + _linear(1024, 10000),
    "seq2seq": (
        2 * 8000 * 256
        + 2 * _lstm(256, 128)
        + 2 * _lstm(256, 256)
        + _linear(512, 256)
        + _linear(256, 8000)
    ),
    "snn": _linear(784, 2048) + 7 * _linear(2048, 2048) + _linear(2048, 10),
    # our own small models (realrun/zoo/small.py)
    "mlp_small": _linear(64, 256) + _linear(256, 256) + _linear(256, 10),
    "cnn_small": (1 * 9 * 16 + 16) + (16 * 9 * 32 + 32) + _linear(512, 10),
    # the validation models (realrun/zoo/small.py)
    "mlp_medium": _linear(256, 1024) + 2 * _linear(1024, 1024) + _linear(1024, 10),
    "cnn_medium": (
        (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 128 + 128) + _linear(2048, 256)
    )
    + _linear(256, 10),
    # the held-out validation models (realrun/zoo/small.py): convolutions, batch norms
    "resnet_small": (3 * 9 * 16 + 32)
    + (2 * 16 * 9 * 16 + 2 * 32)
    + (16 * 9 * 32 + 32 * 9 * 32 + 2 * 64 + 16 * 32 + 64)
    + (32 * 9 * 64 + 64 * 9 * 64 + 2 * 128 + 32 * 64 + 128)
    + _linear(64, 10),
    # embeddings and their norm, two encoder layers (attention, feed-forward, two norms)
    "transformer_small": (2000 * 128 + 32 * 128 + 2 * 128 + 2 * 128)
    + 2 * (_linear(128, 384) + _linear(128, 128) + _linear(128, 512) + _linear(512, 128) + 4 * 128)
    + _linear(128, 128)
    + _linear(128, 10),
    # the digits models of the convergence study (realrun/zoo/digits.py)
    "digits_cnn": (9 * 16 + 16) + (16 * 9 * 32 + 32) + _linear(512, 64) + _linear(64, 10),
    "digits_mlp": _linear(64, 128) + 3 * _linear(128, 128) + _linear(128, 10),
    "digits_lstm": _linear(8, 32) + _lstm(32, 64) + _lstm(64, 64) + _linear(64, 10),
    "digits_transformer": (
        _linear(8, 32)
        + 8 * 32
        + 2 * (_linear(32, 96) + _linear(32, 32) + _linear(32, 64) + _linear(64, 32) + 4 * 32)
        + _linear(32, 10)
    ),
}


def test_every_zoo_model_has_an_expected_count() -> None:
    assert set(PUBLISHED) == set(zoo.names())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count(name: str) -> None:
    with torch.device("meta"):
        model = zoo.build(name)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]


@pytest.mark.parametrize("name", ["resnet18", "seq2seq", "transformer"])
def test_example_inputs_run_through_the_model(name: str) -> None:
    with torch.device("meta"):
        model = zoo.build(name)
    inputs = zoo.example_inputs(name, 3, "meta")
    out = model(*inputs)
    assert out.shape[0] == 3


def test_example_inputs_are_reproducible_and_typed() -> None:
    a = zoo.example_inputs("seq2seq", 2, seed=5)
    b = zoo.example_inputs("seq2seq", 2, seed=5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert a[0].dtype == torch.int64 and a[0].shape == (2, 30) and int(a[0].max()) < 8000
    assert zoo.example_inputs("resnet18", 4)[0].shape == (4, 3, 224, 224)


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(KeyError, match="resnet50"):
        zoo.get("resnet51")
