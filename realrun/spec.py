"""The settings of a real run: ``sim run``'s (:class:`simcore.spec.RunSpec`) plus the ones
only a real run has, declared once with :func:`simcore.settings.setting`, so they are
flags of ``sim real``, keys of ``--config`` files and of ``--set`` alike. No torch here."""

from __future__ import annotations

import os
from dataclasses import dataclass

from realrun import zoo
from realrun.job import BACKENDS, CLUSTERS, DEFAULT_REAL_BATCH, DEVICES
from realrun.options import INPUT_SHAPE_HELP
from simcore.settings import setting
from simcore.spec import RunSpec

MAX_DEFAULT_WORKERS = 8

DEFAULT_REAL_MODEL = "resnet18"
"""The zoo model of a real run (and of its profile) when none is named."""


def default_workers(cores: int | None = None) -> int:
    """Worker ranks of a real run when none are asked for: one per core this process may
    use (``cores``, else the machine's), at least 2 so that something is distributed and
    at most :data:`MAX_DEFAULT_WORKERS`, rounded down to a power of two (gossip needs one).
    A rank that computes while another shares its core takes twice as long, so more
    workers than cores measure the machine's scheduler rather than the scheme."""
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    n = max(2, min(MAX_DEFAULT_WORKERS, cores))
    return 1 << (n.bit_length() - 1)


@dataclass(frozen=True, kw_only=True)
class RealSpec(RunSpec):
    """A real run, as a person describes it."""

    gpus: int | None = setting(
        None,
        "number of worker ranks (ps and p3 add their servers)",
        kind="int",
        minimum=1,
        auto=f"one per core of this machine, 2 to {MAX_DEFAULT_WORKERS}, a power of two",
        flag=2,
    )

    model: str | None = setting(
        None,
        f"zoo model ({', '.join(zoo.names())}), or your own: FILE.py:NAME or "
        "package.module:NAME, a callable returning an nn.Module or (module, example_input)",
        auto=DEFAULT_REAL_MODEL,
        flag=3,
        metavar="NAME|FILE.py:NAME",
    )
    input_shape: str | None = setting(
        None,
        INPUT_SHAPE_HELP,
        auto="the zoo model's input, or the example your callable returns",
        flag=19,
        metavar="SHAPE",
    )
    batch_size: int | None = setting(
        None,
        "samples per worker per iteration",
        kind="int",
        minimum=1,
        auto=str(DEFAULT_REAL_BATCH),
        flag=6,
    )
    backend: str | None = setting(
        None,
        "torch.distributed backend",
        choices=BACKENDS,
        auto="nccl where CUDA is present, else gloo",
        flag=20,
    )
    cluster: str = setting(
        "local",
        "local: ranks on this machine over loopback, unshaped; "
        "netns: every host in its own network namespace, links "
        "shaped to --bandwidth (needs root)",
        choices=CLUSTERS,
        flag=21,
    )
    lr: float = setting(0.01, "learning rate", positive=True, flag=22, metavar="FLOAT")
    timeout_s: float = setting(
        120.0,
        "seconds without progress after which a run counts as hung",
        minimum=1,
        flag=23,
        metavar="SECONDS",
    )
    device: str = setting(
        "cpu",
        "cpu: real torch compute on this machine's cores; emulated: a model built from the "
        "layer trace --model names, whose compute takes the trace's times as waits that "
        "use no CPU (a GPU host; see docs/emulated_devices.md)",
        choices=DEVICES,
        flag=24,
    )
    dilation: float = setting(
        1.0,
        "emulated devices: compute takes K times the trace's times and links run at "
        "--bandwidth / K; reports divide the times by K",
        minimum=1,
        flag=25,
        metavar="K",
    )
    byte_scale: float | None = setting(
        None,
        "emulated devices: parameters and activations are B times smaller and links run "
        "B times slower, so every transfer takes its full-size time",
        minimum=1,
        auto="the smallest B that keeps the shaped links' packet work and the ranks' "
        "memory within this machine",
        flag=26,
        metavar="B",
    )
