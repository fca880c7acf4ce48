"""A Transformer encoder classifier with BERT-base's shape (Devlin et al. 2019).

Embeddings (30,522 words, 512 positions, 2 segment types, layer norm), 12 post-norm
encoder layers (768 wide, 12 heads, 3072 feed-forward, GELU), a tanh pooler on the first
token and a 2-way classifier: 109,482,240 parameters up to the pooler (BERT-base's
published count) and 109,483,778 with the classifier. The encoder layers are
``nn.TransformerEncoderLayer`` modules, each one node of the layer graph.
"""

from __future__ import annotations

import torch
from torch import nn


class TransformerClassifier(nn.Module):
    """Token ids ``(batch, tokens)`` -> class logits ``(batch, classes)``."""

    def __init__(
        self,
        vocab: int = 30522,
        max_positions: int = 512,
        width: int = 768,
        depth: int = 12,
        heads: int = 12,
        ff: int = 3072,
        num_classes: int = 2,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, width)
        self.position_embeddings = nn.Embedding(max_positions, width)
        self.token_type_embeddings = nn.Embedding(2, width)
        self.embed_norm = nn.LayerNorm(width, eps=1e-12)
        self.embed_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                heads,
                ff,
                dropout=dropout,
                activation="gelu",
                batch_first=True,
                layer_norm_eps=1e-12,
            )
            for _ in range(depth)
        )
        self.pooler = nn.Linear(width, width)
        self.pooler_activation = nn.Tanh()
        self.classifier_dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Class logits for a batch of token id sequences (all of segment type 0)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        segments = torch.zeros_like(ids)
        x = (
            self.word_embeddings(ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(segments)
        )
        x = self.embed_dropout(self.embed_norm(x))
        for layer in self.layers:
            x = layer(x)
        pooled = self.pooler_activation(self.pooler(x[:, 0]))
        return self.classifier(self.classifier_dropout(pooled))


def transformer() -> TransformerClassifier:
    """The zoo's Transformer: BERT-base shape with a 2-way classifier."""
    return TransformerClassifier()
