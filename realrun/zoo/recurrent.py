"""Recurrent models: a residual LSTM language model and a Sockeye-like translation model.

Both are our own definitions (sizes below), written so that ``torch.fx`` can trace them:
whole sequences go through ``nn.LSTM`` modules, no Python loop over time steps.

Residual LSTM (``residual_lstm``): 10,000-word embedding of width 1024, four LSTM layers
of 1024 units each wrapped in a residual connection (``x + lstm(x)``, as in GNMT's deeper
layers), dropout 0.2, a linear decoder to the vocabulary. Parameters:
``10000*1024 + 4*(4*1024*(1024+1024) + 8*1024) + 1024*10000 + 10000`` = 54,077,200.

Seq2seq (``seq2seq``): 8,000-word source and target embeddings of width 256; the encoder
is a bidirectional LSTM (128 units each way) followed by a 256-unit LSTM; the decoder is a
256-unit LSTM over the (teacher-forced) target, dot-product attention over the encoder
states, a tanh projection of ``[decoder state; context]`` to 256 and an output layer to
the target vocabulary, like Sockeye's RNN models with dot attention and no input feeding:
7,731,264 parameters.
"""

from __future__ import annotations

import torch
from torch import nn


class ResidualLSTM(nn.Module):
    """Word ids ``(batch, steps)`` -> next-word logits ``(batch, steps, vocab)``."""

    def __init__(
        self, vocab: int = 10000, width: int = 1024, depth: int = 4, dropout: float = 0.2
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.lstms = nn.ModuleList(nn.LSTM(width, width, batch_first=True) for _ in range(depth))
        self.dropout = nn.Dropout(dropout)
        self.decoder = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary at every step."""
        x = self.embedding(ids)
        for lstm in self.lstms:
            out, _state = lstm(x)
            x = x + out
        return self.decoder(self.dropout(x))


class Seq2Seq(nn.Module):
    """Source ids ``(batch, S)`` and target ids ``(batch, T)`` -> logits
    ``(batch, T, target vocab)``."""

    def __init__(
        self, src_vocab: int = 8000, tgt_vocab: int = 8000, width: int = 256, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.src_embedding = nn.Embedding(src_vocab, width)
        self.tgt_embedding = nn.Embedding(tgt_vocab, width)
        self.encoder_birnn = nn.LSTM(width, width // 2, batch_first=True, bidirectional=True)
        self.encoder_rnn = nn.LSTM(width, width, batch_first=True)
        self.decoder_rnn = nn.LSTM(width, width, batch_first=True)
        self.softmax = nn.Softmax(dim=-1)
        self.hidden = nn.Linear(2 * width, width)
        self.hidden_activation = nn.Tanh()
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(width, tgt_vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Target-side logits under teacher forcing."""
        enc, _ = self.encoder_birnn(self.src_embedding(src))
        enc, _ = self.encoder_rnn(enc)
        dec, _ = self.decoder_rnn(self.tgt_embedding(tgt))
        weights = self.softmax(torch.bmm(dec, enc.transpose(1, 2)))
        context = torch.bmm(weights, enc)
        h = self.hidden_activation(self.hidden(torch.cat([dec, context], -1)))
        return self.output(self.dropout(h))


def residual_lstm() -> ResidualLSTM:
    """The zoo's residual LSTM language model."""
    return ResidualLSTM()


def seq2seq() -> Seq2Seq:
    """The zoo's small translation model."""
    return Seq2Seq()
