"""bench/bench_run.py: the verdicts it ends with against the main job's two targets."""

from __future__ import annotations

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), "..", "bench", "bench_run.py")
_spec = importlib.util.spec_from_file_location("bench_run", _PATH)
assert _spec is not None and _spec.loader is not None
bench_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_run)


def test_end_to_end_passes_at_or_under_its_bound_and_fails_over_it() -> None:
    target = bench_run.TARGET_END_TO_END
    assert bench_run.verdict("end to end", target, target, at_most=True).endswith(": PASS")
    assert bench_run.verdict("end to end", 2.49, 2.5, at_most=True) == (
        "end to end         2.49x, target at most 2.50x: PASS"
    )
    assert bench_run.verdict("end to end", 3.73, 2.5, at_most=True).endswith(
        "3.73x, target at most 2.50x: FAIL"
    )


def test_event_rate_passes_at_or_over_its_bound_and_fails_under_it() -> None:
    target = bench_run.TARGET_EVENT_RATIO
    assert bench_run.verdict("event rate", target, target, at_most=False).endswith(": PASS")
    assert bench_run.verdict("event rate", 0.31, 0.25, at_most=False).endswith(
        "0.31x, target at least 0.25x: PASS"
    )
    assert bench_run.verdict("event rate", 0.19, 0.25, at_most=False).endswith(
        "0.19x, target at least 0.25x: FAIL"
    )
