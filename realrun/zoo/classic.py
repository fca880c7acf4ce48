"""Plain convolutional networks: AlexNet, VGG-16/19 and SqueezeNet 1.0.

Layouts follow torchvision's definitions (same layers, shapes and parameter counts);
activations are not in-place so every layer can be timed on its own.
"""

from __future__ import annotations

import torch
from torch import nn


class AlexNet(nn.Module):
    """AlexNet as torchvision defines it (one-tower variant, 61,100,840 parameters)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 3x224x224 images."""
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


VGG_CONFIGS: dict[str, list[int | str]] = {
    "D": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "E": [
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        512,
        "M",
    ],
}
"""VGG configurations (Simonyan and Zisserman, table 1): channels of each 3x3 convolution,
``"M"`` for a 2x2 max-pool."""


class VGG(nn.Module):
    """VGG without batch normalisation: convolution stack, 7x7 pooling, three linears."""

    def __init__(self, config: str, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for item in VGG_CONFIGS[config]:
            if item == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                out = int(item)
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
                channels = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 3x224x224 images."""
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class Fire(nn.Module):
    """SqueezeNet's fire module: a 1x1 squeeze, then 1x1 and 3x3 expands concatenated."""

    def __init__(self, in_ch: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_ch, squeeze, kernel_size=1)
        self.squeeze_activation = nn.ReLU()
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, kernel_size=1)
        self.expand1x1_activation = nn.ReLU()
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Squeeze, expand along two branches, join them along channels."""
        s = self.squeeze_activation(self.squeeze(x))
        return torch.cat(
            [
                self.expand1x1_activation(self.expand1x1(s)),
                self.expand3x3_activation(self.expand3x3(s)),
            ],
            1,
        )


class SqueezeNet(nn.Module):
    """SqueezeNet 1.0 (1,248,424 parameters)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, kernel_size=7, stride=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(96, 16, 64, 64),
            Fire(128, 16, 64, 64),
            Fire(128, 32, 128, 128),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(256, 32, 128, 128),
            Fire(256, 48, 192, 192),
            Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(512, 64, 256, 256),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Conv2d(512, num_classes, kernel_size=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d((1, 1)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 3x224x224 images."""
        return torch.flatten(self.classifier(self.features(x)), 1)


def alexnet() -> AlexNet:
    """AlexNet for 1000 ImageNet classes."""
    return AlexNet()


def vgg16() -> VGG:
    """VGG-16 for 1000 classes (138,357,544 parameters)."""
    return VGG("D")


def vgg19() -> VGG:
    """VGG-19 for 1000 classes (143,667,240 parameters)."""
    return VGG("E")


def squeezenet1_0() -> SqueezeNet:
    """SqueezeNet 1.0 for 1000 classes."""
    return SqueezeNet()
