"""Small models for real multi-process runs on a CPU: seconds per run, so tests and quick
validations can train them with several ranks on two cores.

* ``mlp_small``: 64 inputs (an 8x8 image flattened, the shape of scikit-learn's digits),
  two hidden layers of 256 units with ReLU, 10 classes: ``64*256 + 256 + 256*256 + 256 +
  256*10 + 10`` = 85,002 parameters.
* ``cnn_small``: a 1x16x16 image, two 3x3 convolutions (16 and 32 channels, ReLU, 2x2
  max-pooling after each), a linear classifier of 10 classes: 160 + 4,640 + 5,130 = 9,930
  parameters. No batch normalisation, so a data-parallel run equals one process on the
  concatenated batches (batch statistics would differ per replica).
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
