"""``spectrain``: asynchronous 1F1B pipeline with weight prediction (docs/schemes.md,
section 8).

The same 1F1B schedule as ``pipedream`` on a straight pipeline, without stashing: before
each pass a stage predicts the weights it will have when the micro-batch's other pass
runs, ``W_hat = W - s * lr * v`` (``v`` the momentum-smoothed gradient), runs the pass
with them and goes on with ``W``. The reference code (ntueclab/SpecTrain-PyTorch) uses a
version difference ``s = floor(k/2) + N - k - 1`` for the forward and ``floor(k/2)`` for
the backward at stage ``k`` (see :func:`version_difference`), so both passes of a
micro-batch target the same future version. Cost in time: one weight-sized vector
operation per pass; in memory: one buffer for the prediction, no stash.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from simcore.schedule import Schedule, one_f_one_b
from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures, PipelineScheme


class SpecTrain(PipelineScheme):
    """SpecTrain (see module docs)."""

    name = "spectrain"
    summary = "asynchronous 1F1B pipeline with weight prediction instead of stashing"
    Options = MicrobatchOptions
    features = PipelineFeatures(predict=True, flush=False, microbatches_per_gpu=1)
    same_numerics = False
    update_per_microbatch = True
    convergence_variants = MappingProxyType({"spectrain": {}})

    @classmethod
    def make_schedule(
        cls, stages: tuple[tuple[int, ...], ...], microbatches: int, iterations: int, options: Any
    ) -> Schedule:
        return one_f_one_b(
            stages, microbatches, iterations, stash=False, predict=True, name="spectrain"
        )
