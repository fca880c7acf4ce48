"""SimPy's private internals are used in one module (simcore/clock.py): fail loudly if a
SimPy release changes them, refuse negative delays, and keep every access in that module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import simpy
from simpy import Environment

from simcore.clock import (
    TESTED_SIMPY,
    EventQueue,
    FastEvent,
    check_simpy,
    run_to_end,
    scheduled_events,
)
from simcore.device import Gpu

ROOT = Path(__file__).resolve().parent.parent
PRIVATE = {"_queue", "_eid", "_now", "_value", "_ok"}
"""SimPy's private attributes the fast event path relies on."""


def test_simpy_internals_are_what_the_fast_path_relies_on():
    check_simpy()  # raises SimPyInternalsChanged, naming the SimPy version, if not


def test_simpy_is_a_tested_release_and_pinned_as_such():
    low, high = re.fullmatch(r">=([\d.]+),<([\d.]+)", TESTED_SIMPY).groups()

    def version(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split(".")[:3])

    assert version(low) <= version(simpy.__version__) < version(high), simpy.__version__
    assert f'"simpy{TESTED_SIMPY}"' in (ROOT / "pyproject.toml").read_text()


def test_a_negative_delay_raises():
    env = Environment()
    env.run(until=1.0)
    with pytest.raises(ValueError, match="negative delay"):
        EventQueue(env).at(0.5, FastEvent())


def test_a_negative_compute_duration_raises_and_the_clock_never_goes_back():
    env = Environment()
    gpu = Gpu(env, 0, 0, "gpu0", None)
    with pytest.raises(ValueError, match="negative compute duration"):
        gpu.compute(-0.5, "forward")
    gpu.compute(0.25, "forward")
    env.run()
    assert env.now == 0.25


def test_fast_events_count_as_simpy_events():
    env = Environment()
    q = EventQueue(env)
    for t in (1.0, 2.0):
        q.at(t, FastEvent())
    env.timeout(3.0)
    env.run()
    assert scheduled_events(env) == 3


def test_push_is_at_without_the_check():
    # The same tuple on the same heap as at (the same order and event ids), but a past
    # time is the caller's to rule out.
    env = Environment()
    checked, unchecked = EventQueue(env), EventQueue(env)
    a, b = FastEvent(), FastEvent()
    checked.at(1.0, a)
    unchecked.push(1.0, b)
    assert env._queue == [(1.0, 1, 0, a), (1.0, 1, 1, b)]
    env.run(until=1.5)
    c = FastEvent()
    unchecked.push(0.5, c)  # no ValueError: ruling a past time out is the caller's part
    assert [e for t, _, _, e in env._queue if t == 0.5] == [c]


def test_only_the_clock_module_touches_simpy_internals():
    """Attribute reads of SimPy's private names (``env._now``, ``ev._value``...) appear in
    simcore/clock.py only (schemes owned elsewhere are listed while they are moved)."""
    allowed = {
        ROOT / "simcore" / "clock.py",
        ROOT / "simcore" / "schemes" / "_psbase.py",
    }  # ev._value of its own events
    offenders = []
    for path in sorted((ROOT / "simcore").rglob("*.py")):
        if path in allowed:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


def _story(env: Environment, log: list[tuple[float, str]]) -> None:
    """Two processes, a shared event and fast events: what run_to_end must replay."""
    queue = EventQueue(env)
    signal = env.event()

    def waiter():
        value = yield signal
        log.append((env.now, f"woken with {value}"))
        yield env.timeout(0.5)
        log.append((env.now, "waiter done"))

    def worker():
        for i in range(3):
            yield env.timeout(1.0)
            log.append((env.now, f"tick {i}"))
        signal.succeed("go")
        done = FastEvent([lambda _ev: log.append((env.now, "fast"))])
        queue.at(env.now + 0.25, done)

    env.process(waiter())
    env.process(worker())


def test_run_to_end_replays_env_run_event_by_event():
    logs = []
    for run in (Environment.run, run_to_end):
        env = Environment()
        log: list[tuple[float, str]] = []
        _story(env, log)
        run(env)
        logs.append((log, env.now, scheduled_events(env)))
    assert logs[0] == logs[1]
    assert logs[1][0] == [
        (1.0, "tick 0"),
        (2.0, "tick 1"),
        (3.0, "tick 2"),
        (3.0, "woken with go"),
        (3.25, "fast"),
        (3.5, "waiter done"),
    ]


def test_run_to_end_raises_what_a_process_raised_as_env_run_does():
    def broken(env):
        yield env.timeout(1.0)
        raise KeyError("no such shard")

    for run in (Environment.run, run_to_end):
        env = Environment()
        env.process(broken(env))
        with pytest.raises(KeyError, match="no such shard"):
            run(env)
        assert env.now == 1.0
