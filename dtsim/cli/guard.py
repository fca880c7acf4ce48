"""Refusing work this machine could not finish, and a progress bar for long runs.

Before ``sim run`` simulates, :func:`check_work` compares the estimate of
:mod:`simcore.guard` with this machine's memory and a time budget, and refuses (one line,
exit 2) what would not finish, saying the estimate and what to change. While it runs,
:func:`progress_bar` draws a tqdm bar on a terminal once a run has taken more than a
couple of seconds.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from dtsim.cli.errors import BadInput
from simcore.units import format_bytes, format_time

MEMORY_SHARE = 0.75
"""Share of this machine's memory a run may be estimated to use."""
MAX_SECONDS = 3600.0
"""Longest estimated simulation accepted (an hour)."""
MAX_SCHEDULE_ACTIONS = 5_000_000
"""Largest pipeline schedule ``sim schedule`` lays out (actions; 2e6 take about 20 s
and 1 GB here)."""
BAR_DELAY_S = 2.0
"""A progress bar appears once a run has taken this long."""


def machine_memory() -> int:
    """Bytes of physical memory of this machine (24 GiB if it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 24 << 30


def check_work(config: Any) -> Any:
    """The :class:`~simcore.guard.WorkEstimate` of ``config``; a :class:`BadInput` (exit
    2) if it needs more memory or time than this machine gives (see module docs)."""
    from simcore.guard import estimate

    est = estimate(config)
    mem_limit = MEMORY_SHARE * machine_memory()
    too_big = est.memory_bytes > mem_limit
    too_long = est.seconds > MAX_SECONDS
    if not (too_big or too_long):
        return est
    gpus = getattr(config.topology, "gpus", None) or config.topology.num_gpus
    ways = []
    if config.fidelity == "detailed":
        ways.append("--fidelity analytic")
    if config.iterations > 5:
        ways.append(f"fewer --iterations (asked {config.iterations})")
    if gpus > 64:
        ways.append(f"fewer --gpus (asked {gpus:,})")
    if config.record_spans:
        ways.append("no --trace-out")
    if not ways:
        ways.append("a smaller configuration")
    what = (f"about {format_bytes(est.memory_bytes)} of memory (this machine has "
            f"{format_bytes(machine_memory())})" if too_big else
            f"about {format_time(est.seconds)} of simulation (at most "
            f"{format_time(MAX_SECONDS)} accepted)")
    raise BadInput(f"this run is too big to finish here: an estimated {est.events:.3g} "
                   f"events and {what}; use {', or '.join(ways)}")


def check_schedule(stages: int, microbatches: int, iterations: int) -> None:
    """Refuse (exit 2) a pipeline schedule too large to lay out and print."""
    from simcore.guard import schedule_actions

    n = schedule_actions(stages, microbatches, iterations)
    if n > MAX_SCHEDULE_ACTIONS:
        raise BadInput(f"this schedule is too big to lay out here: {stages:,} stages x "
                       f"{microbatches:,} micro-batches x {iterations:,} iterations is about "
                       f"{n:.3g} actions (at most {MAX_SCHEDULE_ACTIONS:.3g}); use fewer "
                       f"--microbatches or --stages")


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

    bar = tqdm(total=100, desc="simulating", unit="%", delay=BAR_DELAY_S, leave=False,
               file=sys.stderr, bar_format="{desc} {bar} {percentage:3.0f}% [{elapsed}]")

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
