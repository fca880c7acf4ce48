"""A model as a user writes one, for the held-out validation matrix: ``sim validate
--matrix heldout`` refers to it as ``.../analysis/heldout/user_model.py:wide_mlp``, so
the path through ``realrun.usermodel`` (a file, a callable returning the module and an
example input) is validated too.

``wide_mlp``: 512 features, two hidden layers of 1,536 units with GELU and layer
normalisation, 10 classes: 3,170,314 parameters, more gradient bytes per unit of compute
than any model of the development matrix.
"""

from __future__ import annotations

import torch
from torch import nn


def wide_mlp() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of two inputs."""
    model = nn.Sequential(
        nn.Linear(512, 1536),
        nn.LayerNorm(1536),
        nn.GELU(),
        nn.Linear(1536, 1536),
        nn.LayerNorm(1536),
        nn.GELU(),
        nn.Linear(1536, 10),
    )
    return model, torch.randn(2, 512)
