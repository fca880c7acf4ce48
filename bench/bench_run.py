"""Benchmark the main job, ``sim run --gpus 8 --scheme p3``: wall time and event rate.

1. End to end: runs the command as a user would (a fresh process each time, start-up
   included) and reports the median and best wall time, and its ratio to the bare
   interpreter's start (a fresh Python importing simpy, numpy, yaml and click), the two
   run in turn so that each pair sees the same machine; the ratio is the median over
   the pairs, so a machine faster or slower than another reads the same; in wall time
   and in CPU time (which other jobs on a shared machine change least).
2. Event rates of ``simulate()`` in-process on the same configuration, per second of its
   wall time (set-up, run and metrics included), two ways:
   - *model events*: the events of the simulated system, every compute op finishing and
     every chunk of a message reaching the end of a link (``RunResult.model_events``);
   - *scheduler events*: SimPy events the engine processed (``RunResult.events``). A
     worker queues a run of layers that nothing interrupts as one scheduler event, and a
     one-hop message is one event however many chunks it has, so this undercounts the
     simulated work; it is shown for comparison.
3. Raw SimPy: a single process yielding plain timeouts, events per second, measured in
   the same process right after each run of (2), so that both see the same machine state.

Prints the ratios of (2) to (3): the median over the back-to-back pairs (robust to a
machine whose speed drifts) and best over best, and ends with a pass or fail against the
two targets of the main job (:data:`TARGET_END_TO_END`, :data:`TARGET_EVENT_RATIO`).

Before timing, the project's packages are byte-compiled (what ``pip install`` does), so
that ``sim`` loads its modules from bytecode as the bare start loads its libraries; a
shell with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile them at every start.
Usage::

    python bench/bench_run.py [--repeats 7] [--args "--gpus 8 --scheme p3"]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

import simpy

import analysis
import dtsim
import simcore
import traces
from dtsim.resolve import build_config
from dtsim.spec import RunSpec, apply_settings
from simcore import simulate

TARGET_END_TO_END = 2.5
"""The main job end to end takes at most this many times the bare start (wall, median of
the pairs)."""
TARGET_EVENT_RATIO = 0.25
"""``simulate()`` processes model events at least this share of raw SimPy's rate (median
of the pairs)."""


def sim_executable() -> list[str]:
    """The ``sim`` console script next to this Python, or ``python -m``-style fallback."""
    exe = os.path.join(os.path.dirname(sys.executable), "sim")
    return (
        [exe]
        if os.path.exists(exe)
        else [sys.executable, "-c", "from dtsim.cli import main; main()"]
    )


BARE_START = [sys.executable, "-c", "import simpy, numpy, yaml, click"]
"""The bare interpreter's start: what any simulator in Python with these libraries pays."""


def _timed(cmd: list[str]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds)`` of running ``cmd`` in a fresh process; the CPU time
    (user and system, from the children's resource usage) is what a machine shared with
    other jobs changes least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def byte_compile() -> None:
    """Byte-compile the project's packages where ``sim`` imports them from (into their
    ``__pycache__``, as an installed package has them)."""
    for package in (dtsim, simcore, traces, analysis):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def verdict(label: str, value: float, target: float, at_most: bool) -> str:
    """One line saying whether ``value`` meets ``target`` (``at_most``: an upper bound)."""
    ok = value <= target if at_most else value >= target
    bound = "at most" if at_most else "at least"
    return f"{label:18s} {value:.2f}x, target {bound} {target:.2f}x: {'PASS' if ok else 'FAIL'}"


def end_to_end(
    args: list[str], repeats: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``(wall, cpu)`` seconds of ``sim run ARGS`` and of the bare start, in fresh
    processes, in turn: ``(sim_times, bare_times)``."""
    cmd = [*sim_executable(), "run", *args]
    _timed(BARE_START)  # the first start reads the files from disk
    times, bare = [], []
    for _ in range(repeats):
        bare.append(_timed(BARE_START))
        times.append(_timed(cmd))
    return times, bare


def raw_simpy_rate(n: int = 200_000) -> float:
    """Timeout events per second of one SimPy process doing nothing else."""
    env = simpy.Environment()

    def proc(env: simpy.Environment):
        timeout = env.timeout
        for _ in range(n):
            yield timeout(1)

    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def spec_from_args(args: list[str]) -> RunSpec:
    """The RunSpec for simple ``--flag value`` arguments."""
    settings = {}
    it = iter(args)
    for flag in it:
        settings[flag.lstrip("-").replace("-", "_")] = next(it)
    return apply_settings(RunSpec(), settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--args",
        default="--gpus 8 --scheme p3",
        help="arguments of 'sim run' (simple --flag value pairs)",
    )
    opts = ap.parse_args()
    args = shlex.split(opts.args)

    byte_compile()
    e2e, bare = end_to_end(args, opts.repeats)
    config = build_config(spec_from_args(args), record_spans=False)
    simulate(config)  # warm caches (trace, routes are per run anyway)
    model_rates, sched_rates, raw_rates = [], [], []
    r = simulate(config)
    for _ in range(opts.repeats):
        r = simulate(config)
        model_rates.append(r.model_events / r.wall_s)
        sched_rates.append(r.events / r.wall_s)
        raw_rates.append(raw_simpy_rate())
    med = statistics.median
    print(f"command            sim run {' '.join(args)} (the project byte-compiled first)")
    wall, cpu = [w for w, _ in e2e], [c for _, c in e2e]
    bare_wall, bare_cpu = [w for w, _ in bare], [c for _, c in bare]
    print(
        f"end to end         median {med(wall):.3f} s, best {min(wall):.3f} s "
        f"over {opts.repeats} fresh processes; CPU median {med(cpu):.3f} s"
    )
    print(
        f"bare start         median {med(bare_wall):.3f} s, CPU {med(bare_cpu):.3f} s "
        "(python -c 'import simpy, numpy, yaml, click')"
    )
    e2e_ratio = med(x / y for x, y in zip(wall, bare_wall, strict=True))
    print(
        f"end to end / bare  {e2e_ratio:.2f}x wall, "
        f"{med(x / y for x, y in zip(cpu, bare_cpu, strict=True)):.2f}x CPU (medians of the pairs)"
    )
    print(
        f"simulate()         median {med(r.events / x for x in sched_rates) * 1e3:.1f} ms "
        f"in-process"
    )
    print(
        f"raw SimPy          {med(raw_rates):,.0f} timeouts/s (median; best {max(raw_rates):,.0f})"
    )
    paired = {}
    for label, count, rates in (
        ("model events", r.model_events, model_rates),
        ("scheduler events", r.events, sched_rates),
    ):
        paired[label] = med(x / y for x, y in zip(rates, raw_rates, strict=True))
        print(
            f"{label:18s} {count:,} per run, {med(rates):,.0f}/s (median); "
            f"ratio to raw SimPy {paired[label]:.2f} (median of pairs), "
            f"{max(rates) / max(raw_rates):.2f} (best/best)"
        )
    print(verdict("target end to end", e2e_ratio, TARGET_END_TO_END, at_most=True))
    print(verdict("target event rate", paired["model events"], TARGET_EVENT_RATIO, at_most=False))


if __name__ == "__main__":
    main()
