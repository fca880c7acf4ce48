"""Residual networks (He et al.): ResNet-18/50/101/152 in torchvision's layout.

The bottleneck block strides in its 3x3 convolution ("v1.5"), as torchvision does.
The residual sum is an explicit ``add`` (not in-place), so the layer graph shows the join.
"""

from __future__ import annotations

import torch
from torch import nn


def _conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, in_ch: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_ch, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual branch plus shortcut, then ReLU."""
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a shortcut (ResNet-50 and up)."""

    expansion = 4

    def __init__(
        self, in_ch: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_ch, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu2 = nn.ReLU()
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu3 = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Residual branch plus shortcut, then ReLU."""
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu3(out + shortcut)


class ResNet(nn.Module):
    """Stem (7x7 convolution, max-pool), four stages of blocks, average pool, classifier."""

    def __init__(
        self, block: type[BasicBlock] | type[Bottleneck], depths: list[int], num_classes: int = 1000
    ) -> None:
        super().__init__()
        self.in_ch = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._stage(block, 64, depths[0], stride=1)
        self.layer2 = self._stage(block, 128, depths[1], stride=2)
        self.layer3 = self._stage(block, 256, depths[2], stride=2)
        self.layer4 = self._stage(block, 512, depths[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _stage(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, blocks: int, stride: int
    ) -> nn.Sequential:
        out_ch = planes * block.expansion
        downsample = None
        if stride != 1 or self.in_ch != out_ch:
            downsample = nn.Sequential(_conv1x1(self.in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))
        layers = [block(self.in_ch, planes, stride, downsample)]
        self.in_ch = out_ch
        layers += [block(self.in_ch, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 3x224x224 images."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> ResNet:
    """ResNet-18 (11,689,512 parameters)."""
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    """ResNet-50 (25,557,032 parameters)."""
    return ResNet(Bottleneck, [3, 4, 6, 3])


def resnet101() -> ResNet:
    """ResNet-101 (44,549,160 parameters)."""
    return ResNet(Bottleneck, [3, 4, 23, 3])


def resnet152() -> ResNet:
    """ResNet-152 (60,192,808 parameters)."""
    return ResNet(Bottleneck, [3, 8, 36, 3])
