"""Real data for convergence runs: scikit-learn's handwritten digits (1,797 grey 8x8
images of 10 classes, shipped inside the package, nothing downloaded).

**Split.** A permutation seeded by the run's seed puts 20% of the images in the
validation split and the rest in the training split; every pixel is standardised with
the training split's mean and standard deviation.

**Order.** Epoch ``e`` visits the training split in the order of a permutation seeded by
``(seed, e)``, cut into *update batches* of ``B`` samples (the last partial one dropped):
``U`` = ``n // B`` per epoch, update batch ``u`` of the run being chunk ``u mod U`` of
epoch ``u // U``. Every scheme makes one weight update per update batch, on the same
samples in the same order; only how an update batch is divided differs:

* data-parallel schemes (``dp``, ``ps``, ``p3``, ``gossip``): iteration ``i`` is update
  batch ``i``; worker ``r`` takes samples ``[r*b, (r+1)*b)`` of it, ``b`` =
  ``batch_size`` per worker and ``B`` = ``workers * b``;
* ``mp`` and ``gpipe``: iteration ``i`` is update batch ``i`` (``B`` = ``batch_size``),
  cut into micro-batches in order (:func:`realrun.pipeline.microbatch`);
* ``pipedream`` and ``spectrain`` update after every micro-batch: iteration ``i`` is
  update batches ``i*M .. i*M+M-1`` (``batch_size`` = ``M * B``), micro-batch ``j`` of it
  being update batch ``i*M + j``.

Each model takes the 64 pixels in its own shape (a 1x8x8 image, 64 features, or 8 rows
of 8), the shape of its zoo input.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from realrun.job import DATASETS

__all__ = ["DATASETS", "Split", "batch", "load", "update_batch", "updates_per_epoch", "validation"]

VALIDATION_FRACTION = 0.2
"""Share of the images held out for validation."""


@dataclass(frozen=True)
class Split:
    """A standardised train/validation split.

    Attributes:
        train_x: training images, ``(n, 64)`` float32.
        train_y: their labels, ``(n,)`` int64.
        val_x: validation images.
        val_y: their labels.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor


def _check(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"data: {name!r} is not allowed; choose one of: {', '.join(DATASETS)}")


@functools.lru_cache(maxsize=8)
def load(name: str, seed: int) -> Split:
    """The split of data set ``name`` for ``seed`` (see module docs; cached)."""
    _check(name)
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.as_tensor(d.data, dtype=torch.float64)
    y = torch.as_tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = round(len(y) * VALIDATION_FRACTION)
    val, train = perm[:n_val], perm[n_val:]
    mean = x[train].mean(0)
    std = x[train].std(0)
    std[std == 0] = 1.0
    x = ((x - mean) / std).float()
    return Split(x[train], y[train], x[val], y[val])


def batches_per_epoch(name: str, seed: int, size: int) -> int:
    """Whole batches of ``size`` samples in one pass over the training split."""
    n = len(load(name, seed).train_y)
    if not 0 < size <= n:
        raise ValueError(
            f"batch: {size} is not allowed; the {name} training split has {n} "
            f"samples, so give 1 to {n}"
        )
    return n // size


@functools.lru_cache(maxsize=64)
def epoch_order(name: str, seed: int, epoch: int) -> torch.Tensor:
    """Indices of the training split in epoch ``epoch``'s order."""
    n = len(load(name, seed).train_y)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) * 31 + 17)
    return torch.randperm(n, generator=gen)


def update_indices(name: str, seed: int, size: int, update: int) -> torch.Tensor:
    """Training-split indices of update batch ``update`` (of ``size`` samples)."""
    per = batches_per_epoch(name, seed, size)
    epoch, i = divmod(update, per)
    return epoch_order(name, seed, epoch)[i * size : (i + 1) * size]


def shaped(model: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Images ``(n, 64)`` in the input shape of zoo model ``model``."""
    from realrun import zoo

    specs = zoo.get(model).inputs
    if len(specs) != 1 or specs[0].dtype != "float32" or _numel(specs[0].shape) != x.shape[1]:
        raise ValueError(
            f"model: {model!r} cannot read 8x8 images; choose a model that takes 64 "
            "float inputs, e.g. digits_cnn, digits_mlp, digits_lstm or digits_transformer"
        )
    return (x.reshape(len(x), *specs[0].shape).contiguous(),)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def data_workers(job: Any) -> int:
    """Workers that split an update batch: the job's workers, or 1 for a pipeline."""
    from simcore.schemes import get_scheme

    return 1 if get_scheme(job.scheme).pipeline else job.workers


def updates_per_iteration(job: Any) -> int:
    """Weight updates per iteration: a micro-batch each in the asynchronous pipelines
    (whose class says ``update_per_microbatch``: PipeDream's 1F1B updates after every
    backward), one otherwise."""
    from simcore.schemes import get_scheme

    if get_scheme(job.scheme).update_per_microbatch:
        return int(job.pipeline["microbatches"])
    return 1


def update_batch(job: Any) -> int:
    """Samples per weight update, over all workers (see module docs)."""
    return job.batch_size * data_workers(job) // updates_per_iteration(job)


def updates_per_epoch(job: Any) -> int:
    """Whole update batches in one pass over the training split."""
    return batches_per_epoch(job.data, job.seed, update_batch(job))


def batch(job: Any, rank: int, iteration: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Worker ``rank``'s inputs and labels of ``iteration`` (see module docs)."""
    split = load(job.data, job.seed)
    k = updates_per_iteration(job)
    b = update_batch(job)
    idx = torch.cat([update_indices(job.data, job.seed, b, iteration * k + j) for j in range(k)])
    idx = idx[rank * job.batch_size : (rank + 1) * job.batch_size]
    return shaped(job.model, split.train_x[idx]), split.train_y[idx]


def validation(job: Any) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The validation split, shaped for the job's model."""
    split = load(job.data, job.seed)
    return shaped(job.model, split.val_x), split.val_y
