"""Small models of the SpecTrain paper's four families, sized for scikit-learn's digits
(1,797 grey 8x8 images, 10 classes; :mod:`realrun.data`): an epoch trains in a fraction of
a second on one CPU core, so many epochs of many schemes and seeds fit in minutes.

Each has at least four layers with parameters, so a 4-stage pipeline has weights on every
stage, and none has batch normalisation or dropout: a data-parallel or pipelined run then
computes exactly what one process computes on the same samples, and the emulator
(:mod:`realrun.emulate`) can match the distributed run to float tolerance.

* ``digits_cnn`` (1x8x8 image): two 3x3 convolutions (16 and 32 channels, ReLU, a 2x2
  max-pool after the second), a 512-64 hidden layer and a 10-way classifier: 160 + 4,640
  + 32,832 + 650 = 38,282 parameters.
* ``digits_mlp`` (64 features): self-normalising (SELU, LeCun-normal initialisation), four
  hidden layers of 128 units and a classifier: 8,320 + 3 x 16,512 + 1,290 = 59,146
  parameters. Alpha dropout is left out (see above).
* ``digits_lstm`` (8 rows of 8 pixels as a sequence): a linear projection of each row to
  32, two LSTM layers of 64 units, a classifier on the last step: 288 + 25,088 + 33,280
  + 650 = 59,306 parameters.
* ``digits_transformer`` (8 rows as 8 tokens): a linear embedding of each row to 32 plus a
  learned position embedding, two post-norm encoder layers (4 heads, feed-forward 64,
  GELU), mean pooling and a classifier: 288 + 256 + 2 x 8,544 + 330 = 17,962 parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """1x8x8 images -> class logits."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.act1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.act2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 4 * 4, 64)
        self.act3 = nn.ReLU()
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of images."""
        x = self.pool(self.act2(self.conv2(self.act1(self.conv1(x)))))
        return self.head(self.act3(self.fc(torch.flatten(x, 1))))


class DigitsMLP(nn.Module):
    """64 features -> class logits through SELU layers (self-normalising)."""

    def __init__(
        self, in_features: int = 64, hidden: int = 128, depth: int = 4, num_classes: int = 10
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            linear = nn.Linear(width, hidden)
            nn.init.normal_(linear.weight, std=1.0 / math.sqrt(width))
            nn.init.zeros_(linear.bias)
            layers += [linear, nn.SELU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of feature vectors."""
        return self.head(self.body(x))


class DigitsLSTM(nn.Module):
    """8 rows of 8 pixels ``(batch, 8, 8)`` -> class logits, reading the rows in order."""

    def __init__(self, width: int = 32, hidden: int = 64, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.lstm1 = nn.LSTM(width, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Class logits from the last step's state."""
        x, _s1 = self.lstm1(self.embed(rows))
        x, _s2 = self.lstm2(x)
        return self.head(x[:, -1])


class DigitsTransformer(nn.Module):
    """8 rows of 8 pixels ``(batch, 8, 8)`` as 8 tokens -> class logits."""

    def __init__(
        self, width: int = 32, depth: int = 2, heads: int = 4, ff: int = 64, num_classes: int = 10
    ) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.positions = nn.Embedding(8, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width, heads, ff, dropout=0.0, activation="gelu", batch_first=True
            )
            for _ in range(depth)
        )
        self.head = nn.Linear(width, num_classes)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Class logits from the mean of the tokens' final states."""
        positions = torch.arange(rows.shape[1], device=rows.device)
        x = self.embed(rows) + self.positions(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def digits_cnn() -> DigitsCNN:
    """The zoo's digits CNN."""
    return DigitsCNN()


def digits_mlp() -> DigitsMLP:
    """The zoo's digits self-normalising MLP."""
    return DigitsMLP()


def digits_lstm() -> DigitsLSTM:
    """The zoo's digits LSTM."""
    return DigitsLSTM()


def digits_transformer() -> DigitsTransformer:
    """The zoo's digits Transformer."""
    return DigitsTransformer()
