"""Refusing work this machine could not finish, and a progress bar for long runs.

Before ``sim run`` simulates, :func:`check_work` compares the estimate of
:mod:`simcore.guard` with this machine's memory and a time budget, and refuses (one line,
exit 2) what would not finish, saying the estimate and what to change. While it runs,
:func:`progress_bar` draws a tqdm bar on a terminal once a run has taken more than a
couple of seconds.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from dtsim.cli.errors import BadInput
from simcore.guard import machine_memory

MAX_SCHEDULE_ACTIONS = 5_000_000
"""Largest pipeline schedule ``sim schedule`` lays out (actions; 2e6 take about 20 s
and 1 GB here)."""
BAR_DELAY_S = 2.0
"""A progress bar appears once a run has taken this long."""


FLAG_WORDS = (
    ("the analytic fidelity", "--fidelity analytic"),
    ("fewer iterations", "fewer --iterations"),
    ("fewer GPUs", "fewer --gpus"),
    ("no Chrome trace", "no --trace-out"),
)
"""How :func:`simcore.guard.work_refusal`'s ways out read as this command's flags."""


def check_work(config: Any) -> None:
    """Refuse (:class:`BadInput`, exit 2) a run that needs more memory or time than this
    machine gives (:func:`simcore.guard.work_refusal`), naming the flags that help."""
    from simcore.guard import work_refusal

    why = work_refusal(config, machine_memory())
    if why is None:
        return
    for words, flags in FLAG_WORDS:
        why = why.replace(words, flags)
    raise BadInput(why)


def check_schedule(stages: int, microbatches: int, iterations: int) -> None:
    """Refuse (exit 2) a pipeline schedule too large to lay out and print."""
    from simcore.guard import schedule_actions

    n = schedule_actions(stages, microbatches, iterations)
    if n > MAX_SCHEDULE_ACTIONS:
        raise BadInput(
            f"this schedule is too big to lay out here: {stages:,} stages x "
            f"{microbatches:,} micro-batches x {iterations:,} iterations is about "
            f"{n:.3g} actions (at most {MAX_SCHEDULE_ACTIONS:.3g}); use fewer "
            f"--microbatches or --stages"
        )


@contextlib.contextmanager
def progress_bar(enabled: bool | None = None) -> Iterator[Callable[[float], None] | None]:
    """A ``progress(share_done)`` callback drawing a tqdm bar on stderr, shown only once
    the run has taken :data:`BAR_DELAY_S`; ``None`` (no bar, no cost) unless ``enabled``
    (default: stderr is a terminal)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(
        total=100,
        desc="simulating",
        unit="%",
        delay=BAR_DELAY_S,
        leave=False,
        file=sys.stderr,
        bar_format="{desc} {bar} {percentage:3.0f}% [{elapsed}]",
    )

    def update(share: float) -> None:
        pct = int(100 * share)
        if pct > bar.n:
            bar.update(pct - bar.n)
        else:
            bar.refresh()

    try:
        yield update
    finally:
        bar.close()
