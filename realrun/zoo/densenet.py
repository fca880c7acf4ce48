"""DenseNet-121 (Huang et al.) in torchvision's layout (7,978,856 parameters).

Every dense layer concatenates all earlier feature maps of its block before its
bottleneck, so layer ``k`` of a block joins ``k + 1`` inputs: the layer graph's joins
are the test of the profiler's DAG.
"""

from __future__ import annotations

import torch
from torch import nn


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 (to ``bn_size * growth`` channels), BN-ReLU-3x3 (to ``growth``)."""

    def __init__(self, in_ch: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_ch)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_ch, bn_size * growth, kernel_size=1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth, growth, kernel_size=3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        """New feature maps from the concatenation of all earlier ones."""
        x = torch.cat(features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.Module):
    """``n`` dense layers; the block's output concatenates its input and every layer's."""

    def __init__(self, n: int, in_ch: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(in_ch + i * growth, growth, bn_size) for i in range(n)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """All feature maps of the block, concatenated."""
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Module):
    """BN-ReLU-1x1 convolution halving the channels, then 2x2 average pooling."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(in_ch)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_ch, out_ch, kernel_size=1, bias=False)
        self.pool = nn.AvgPool2d(kernel_size=2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Compress and downsample."""
        return self.pool(self.conv(self.relu(self.norm(x))))


class DenseNet(nn.Module):
    """Stem, dense blocks separated by transitions, final norm, pooling and classifier."""

    def __init__(
        self,
        growth: int = 32,
        blocks: tuple[int, ...] = (6, 12, 24, 16),
        init_features: int = 64,
        bn_size: int = 4,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        stem: list[nn.Module] = [
            nn.Conv2d(3, init_features, kernel_size=7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(init_features),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        ]
        body: list[nn.Module] = []
        ch = init_features
        for i, n in enumerate(blocks):
            body.append(DenseBlock(n, ch, growth, bn_size))
            ch += n * growth
            if i != len(blocks) - 1:
                body.append(Transition(ch, ch // 2))
                ch //= 2
        self.features = nn.Sequential(*stem, *body, nn.BatchNorm2d(ch))
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 3x224x224 images."""
        x = self.avgpool(self.relu(self.features(x)))
        return self.classifier(torch.flatten(x, 1))


def densenet121() -> DenseNet:
    """DenseNet-121 for 1000 classes."""
    return DenseNet()
