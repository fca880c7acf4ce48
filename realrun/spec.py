"""The settings of a real run: ``sim run``'s (:class:`simcore.spec.RunSpec`) plus the ones
only a real run has, declared once with :func:`simcore.settings.setting`, so they are
flags of ``sim real``, keys of ``--config`` files and of ``--set`` alike. No torch here."""

from __future__ import annotations

from dataclasses import dataclass

from realrun.job import BACKENDS, CLUSTERS, DEFAULT_REAL_BATCH
from realrun.options import INPUT_SHAPE_HELP
from simcore.settings import setting
from simcore.spec import RunSpec


@dataclass(frozen=True, kw_only=True)
class RealSpec(RunSpec):
    """A real run, as a person describes it."""

    model: str | None = setting(
        None,
        "zoo model (sim profile --help lists them), or your own: FILE.py:NAME or "
        "package.module:NAME, a callable returning an nn.Module or (module, example_input)",
        auto="resnet18",
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
