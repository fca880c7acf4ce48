"""A self-normalising network (Klambauer et al. 2017): a deep MLP with SELU units,
LeCun-normal initialisation and alpha dropout.

Our definition: 784 inputs (a flattened 28x28 image), 8 hidden layers of 2048 units,
10 classes: ``784*2048 + 2048 + 7*(2048*2048 + 2048) + 2048*10 + 10`` = 31,002,634
parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SNN(nn.Module):
    """Linear-SELU-AlphaDropout blocks followed by a linear classifier."""

    def __init__(
        self,
        in_features: int = 784,
        hidden: int = 2048,
        depth: int = 8,
        num_classes: int = 10,
        dropout: float = 0.05,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            linear = nn.Linear(width, hidden)
            nn.init.normal_(linear.weight, std=1.0 / math.sqrt(width))
            nn.init.zeros_(linear.bias)
            layers += [linear, nn.SELU(), nn.AlphaDropout(dropout)]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of feature vectors."""
        return self.head(self.body(x))


def snn() -> SNN:
    """The zoo's SNN (784-2048x8-10)."""
    return SNN()
