"""Small models for real multi-process runs on a CPU: seconds per run, so tests and quick
validations can train them with several ranks on two cores.

* ``mlp_small``: 64 inputs (an 8x8 image flattened, the shape of scikit-learn's digits),
  two hidden layers of 256 units with ReLU, 10 classes: ``64*256 + 256 + 256*256 + 256 +
  256*10 + 10`` = 85,002 parameters.
* ``cnn_small``: a 1x16x16 image, two 3x3 convolutions (16 and 32 channels, ReLU, 2x2
  max-pooling after each), a linear classifier of 10 classes: 160 + 4,640 + 5,130 = 9,930
  parameters. No batch normalisation, so a data-parallel run equals one process on the
  concatenated batches (batch statistics would differ per replica).
* ``mlp_medium``: the same MLP with 256 inputs and three hidden layers of 1,024 units:
  2,372,618 parameters (9.5 MB of float32), enough that all-reducing them on a shaped
  link of 200 Mbit/s to 1 Gbit/s costs as much as, or more than, computing a batch: the
  validation matrix's MLP.
* ``cnn_medium``: a 3x32x32 image, three 3x3 convolutions (32, 64 and 128 channels,
  ReLU, 2x2 max-pooling after each), a hidden linear layer of 256 units and a classifier
  of 10 classes: 896 + 18,496 + 73,856 + 524,544 + 2,570 = 620,362 parameters; compute
  dominated by the convolutions: the validation matrix's CNN.
* ``resnet_small``: a CIFAR-style ResNet on 3x32x32: a 3x3 stem of 16 channels, three
  stages of one basic block each (16, 32 and 64 channels, the last two halving the
  image), batch normalisation, average pooling and a classifier of 10 classes (78,042
  parameters): residual joins, as ResNets have; a held-out validation model.
* ``transformer_small``: the zoo's Transformer classifier at a small shape (2,000 words,
  32 tokens, two encoder layers of width 128, four heads, 512 hidden; no dropout; 10
  classes; 674,954 parameters): attention, layer norms and embeddings; a held-out
  validation model.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallMLP(nn.Module):
    """Linear-ReLU blocks and a linear classifier."""

    def __init__(
        self, in_features: int = 64, hidden: int = 256, depth: int = 2, num_classes: int = 10
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of feature vectors."""
        return self.head(self.body(x))


class MediumCNN(nn.Module):
    """Three convolution blocks, a hidden linear layer and a linear classifier."""

    def __init__(self, channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        width = channels
        for out in (32, 64, 128):
            blocks += [nn.Conv2d(width, out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width = out
        self.features = nn.Sequential(*blocks)
        self.hidden = nn.Sequential(nn.Linear(128 * 4 * 4, 256), nn.ReLU())
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 32x32 images."""
        return self.classifier(self.hidden(torch.flatten(self.features(x), 1)))


class SmallCNN(nn.Module):
    """Two convolution blocks and a linear classifier."""

    def __init__(self, channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of 16x16 images."""
        return self.classifier(torch.flatten(self.features(x), 1))


def mlp_small() -> SmallMLP:
    """The zoo's small MLP (64-256-256-10)."""
    return SmallMLP()


def cnn_small() -> SmallCNN:
    """The zoo's small CNN (1x16x16 -> 10 classes)."""
    return SmallCNN()


def mlp_medium() -> SmallMLP:
    """The validation matrix's MLP (256-1024-1024-1024-10)."""
    return SmallMLP(in_features=256, hidden=1024, depth=3)


def cnn_medium() -> MediumCNN:
    """The validation matrix's CNN (3x32x32 -> 10 classes)."""
    return MediumCNN()


def resnet_small() -> nn.Module:
    """The held-out validation ResNet (see the module's docs)."""
    from realrun.zoo.resnet import BasicBlock

    def stage(in_ch: int, out_ch: int, stride: int) -> nn.Module:
        down = None
        if stride != 1 or in_ch != out_ch:
            down = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )
        return BasicBlock(in_ch, out_ch, stride, down)

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        stage(16, 16, 1),
        stage(16, 32, 2),
        stage(32, 64, 2),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def transformer_small() -> nn.Module:
    """The held-out validation Transformer (see the module's docs)."""
    from realrun.zoo.transformer import TransformerClassifier

    return TransformerClassifier(
        vocab=2000, max_positions=32, width=128, depth=2, heads=4, ff=512, num_classes=10,
        dropout=0.0,
    )  # fmt: skip
