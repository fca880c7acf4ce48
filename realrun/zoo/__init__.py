"""The model zoo: plain torch definitions of the models the project studies.

Each entry of :data:`REGISTRY` names a constructor and the example input of one sample;
:func:`build` makes the model and :func:`example_inputs` a batch of inputs for it. The
vision models follow torchvision's definitions layer for layer (same parameter counts,
torchvision itself is not used); the sequence models and the MLP are our own definitions,
documented in their modules.

Importing this module does not import torch (the command line lists the names cheaply);
the model modules are imported when a model is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InputSpec:
    """One input tensor of a model, per sample.

    Attributes:
        shape: the shape of one sample (the batch dimension is prepended).
        dtype: ``"float32"`` for real-valued data, ``"int64"`` for token ids.
        high: for integer inputs, ids are drawn from ``[0, high)``.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int = 0


@dataclass(frozen=True)
class ZooModel:
    """A registry entry: where the constructor lives and what the model eats.

    Attributes:
        name: the registry key and CLI string (``resnet50``).
        module: the module under ``realrun.zoo`` holding the constructor.
        constructor: the function that builds the model (no arguments needed).
        inputs: the model's inputs, one :class:`InputSpec` each, in call order.
        description: one line for listings.
    """

    name: str
    module: str
    constructor: str
    inputs: tuple[InputSpec, ...]
    description: str


_IMAGE_224 = (InputSpec((3, 224, 224)),)
_IMAGE_299 = (InputSpec((3, 299, 299)),)


def _entry(
    name: str, module: str, constructor: str, inputs: tuple[InputSpec, ...], description: str
) -> tuple[str, ZooModel]:
    return name, ZooModel(name, module, constructor, inputs, description)


REGISTRY: dict[str, ZooModel] = dict(
    [
        _entry("alexnet", "classic", "alexnet", _IMAGE_224, "AlexNet (torchvision layout)"),
        _entry("vgg16", "classic", "vgg16", _IMAGE_224, "VGG-16, configuration D"),
        _entry("vgg19", "classic", "vgg19", _IMAGE_224, "VGG-19, configuration E"),
        _entry("squeezenet1_0", "classic", "squeezenet1_0", _IMAGE_224, "SqueezeNet 1.0"),
        _entry("resnet18", "resnet", "resnet18", _IMAGE_224, "ResNet-18 (basic blocks)"),
        _entry("resnet50", "resnet", "resnet50", _IMAGE_224, "ResNet-50 (bottleneck v1.5)"),
        _entry("resnet101", "resnet", "resnet101", _IMAGE_224, "ResNet-101 (bottleneck v1.5)"),
        _entry("resnet152", "resnet", "resnet152", _IMAGE_224, "ResNet-152 (bottleneck v1.5)"),
        _entry(
            "googlenet",
            "inception",
            "googlenet",
            _IMAGE_224,
            "GoogLeNet (Inception v1, without auxiliary classifiers)",
        ),
        _entry(
            "inception_v3",
            "inception",
            "inception_v3",
            _IMAGE_299,
            "Inception-v3 with its auxiliary classifier, 299x299 input",
        ),
        _entry("densenet121", "densenet", "densenet121", _IMAGE_224, "DenseNet-121 (k=32)"),
        _entry(
            "transformer",
            "transformer",
            "transformer",
            (InputSpec((128,), "int64", 30522),),
            "Transformer encoder classifier, BERT-base shape (12x768), 128 tokens",
        ),
        _entry(
            "residual_lstm",
            "recurrent",
            "residual_lstm",
            (InputSpec((35,), "int64", 10000),),
            "4-layer residual LSTM language model (1024 units, 10k words, 35 steps)",
        ),
        _entry(
            "seq2seq",
            "recurrent",
            "seq2seq",
            (InputSpec((30,), "int64", 8000), InputSpec((30,), "int64", 8000)),
            "Sockeye-like RNN translation model with dot attention (256 units, 8k words)",
        ),
        _entry(
            "snn",
            "mlp",
            "snn",
            (InputSpec((784,)),),
            "Self-normalising MLP: 8 SELU layers of 2048 units with alpha dropout",
        ),
        _entry(
            "mlp_small",
            "small",
            "mlp_small",
            (InputSpec((64,)),),
            "Small MLP for quick real runs: 64-256-256-10",
        ),
        _entry(
            "cnn_small",
            "small",
            "cnn_small",
            (InputSpec((1, 16, 16)),),
            "Small CNN for quick real runs: two 3x3 convolutions on 1x16x16, 10 classes",
        ),
        _entry(
            "mlp_medium",
            "small",
            "mlp_medium",
            (InputSpec((256,)),),
            "Validation MLP: 256-1024-1024-1024-10 (2.4M parameters)",
        ),
        _entry(
            "cnn_medium",
            "small",
            "cnn_medium",
            (InputSpec((3, 32, 32)),),
            "Validation CNN: three 3x3 convolutions on 3x32x32, 256-unit hidden layer",
        ),
        _entry(
            "resnet_small",
            "small",
            "resnet_small",
            (InputSpec((3, 32, 32)),),
            "Held-out validation ResNet: 3 basic blocks (16-32-64) on 3x32x32, batch norm",
        ),
        _entry(
            "transformer_small",
            "small",
            "transformer_small",
            (InputSpec((32,), "int64", 2000),),
            "Held-out validation Transformer: 2 encoder layers of width 128, 32 tokens",
        ),
        _entry(
            "digits_cnn",
            "digits",
            "digits_cnn",
            (InputSpec((1, 8, 8)),),
            "Digits CNN: two 3x3 convolutions, 64 hidden, 10 classes (8x8 images)",
        ),
        _entry(
            "digits_mlp",
            "digits",
            "digits_mlp",
            (InputSpec((64,)),),
            "Digits self-normalising MLP: 4 SELU layers of 128 units (64 features)",
        ),
        _entry(
            "digits_lstm",
            "digits",
            "digits_lstm",
            (InputSpec((8, 8)),),
            "Digits LSTM: rows as an 8-step sequence, two LSTM layers of 64 units",
        ),
        _entry(
            "digits_transformer",
            "digits",
            "digits_transformer",
            (InputSpec((8, 8)),),
            "Digits Transformer: rows as 8 tokens, two encoder layers of width 32",
        ),
    ]
)
"""All zoo models by name."""


def names() -> list[str]:
    """The zoo's model names, in registry order."""
    return list(REGISTRY)


def get(name: str) -> ZooModel:
    """The registry entry called ``name`` (``KeyError`` listing the names if absent)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown zoo model {name!r}; choose one of: {', '.join(REGISTRY)}"
        ) from None


def build(name: str) -> Any:
    """A fresh ``torch.nn.Module`` for zoo model ``name``, on the current default device
    (use ``with torch.device("meta"):`` for a model without memory). A user's model
    (``FILE.py:NAME``) is built by :func:`realrun.usermodel.resolve_model`, which knows
    both kinds."""
    entry = get(name)
    module = importlib.import_module(f"realrun.zoo.{entry.module}")
    return getattr(module, entry.constructor)()


def is_zoo(ref: str) -> bool:
    """Whether ``ref`` names a zoo model."""
    return ref in REGISTRY


def looks_like_reference(ref: str) -> bool:
    """Whether ``ref`` has the form of a user's model, ``FILE.py:NAME`` or
    ``package.module:NAME`` (nothing is loaded)."""
    left, sep, name = ref.rpartition(":")
    return bool(sep and left and name)


def example_inputs(
    name: str,
    batch_size: int,
    device: Any = "cpu",
    seed: int = 0,
) -> tuple[Any, ...]:
    """A batch of ``batch_size`` random inputs for zoo model ``name`` on ``device``
    (reproducible for a given ``seed``; the meta device gets shapes only)."""
    import torch

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    meta = torch.device(device).type == "meta"
    out = []
    for spec in get(name).inputs:
        shape = (batch_size, *spec.shape)
        if meta:
            t = torch.empty(shape, dtype=getattr(torch, spec.dtype), device="meta")
        elif spec.dtype == "int64":
            t = torch.randint(0, spec.high, shape, generator=gen, dtype=torch.int64)
        else:
            t = torch.randn(shape, generator=gen, dtype=getattr(torch, spec.dtype))
        out.append(t.to(device))
    return tuple(out)
