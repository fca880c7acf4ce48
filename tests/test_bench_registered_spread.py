"""bench/registered_spread.py: how repeated registered runs of one matrix agree."""

from __future__ import annotations

import importlib.util
import os

import pandas as pd
import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "bench", "registered_spread.py")
_spec = importlib.util.spec_from_file_location("registered_spread", _PATH)
assert _spec is not None and _spec.loader is not None
registered_spread = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(registered_spread)


def _run(tmp_path, name: str, rows: list[tuple[str, float, float]]) -> str:
    """A validation folder whose cases are ``(id, measured s, predicted s)``."""
    folder = tmp_path / name
    folder.mkdir()
    pd.DataFrame(
        {
            "point_id": [r[0] for r in rows],
            "real_iteration_time_s": [r[1] for r in rows],
            "predicted_iteration_time_s": [r[2] for r in rows],
            "prediction_rel_err": [(r[2] - r[1]) / r[1] for r in rows],
        }
    ).to_csv(folder / "validation.csv", index=False)
    return str(folder)


def test_a_steady_miss_and_a_noisy_case_are_told_apart(tmp_path) -> None:
    a = _run(tmp_path, "dev-a", [("steady", 1.0, 0.8), ("noisy", 1.0, 0.9), ("only-a", 1, 1)])
    b = _run(tmp_path, "dev-b", [("steady", 1.25, 1.0), ("noisy", 0.8, 0.9)])
    runs = registered_spread.load([a, b])
    assert list(runs) == ["a", "b"]  # the names less their common start
    table = registered_spread.spread(runs)
    assert list(table.index) == ["steady", "noisy"]  # only cases in every run, by range
    steady, noisy = table.loc["steady"], table.loc["noisy"]
    assert steady["a"] == pytest.approx(-20.0) and steady["b"] == pytest.approx(-20.0)
    assert steady.range_points == pytest.approx(0.0) and steady.sign == "-"
    assert noisy.range_points == pytest.approx(22.5) and noisy.sign == "mixed"
    assert noisy.measured_max_over_min == pytest.approx(1.25)
    assert noisy.predicted_max_over_min == pytest.approx(1.0)
    lines = registered_spread.summary(runs, table)
    assert lines[0].startswith("a: median |error| 10.0%, max 20.0%")
    assert "same sign in every run: 1 of 2" in lines[-1]


def test_names_lose_only_whole_words_they_share(tmp_path) -> None:
    rows = [("case", 1.0, 1.0)]
    one, ten = _run(tmp_path, "dev1", rows), _run(tmp_path, "dev10", rows)
    assert list(registered_spread.load([one, ten])) == ["dev1", "dev10"]
