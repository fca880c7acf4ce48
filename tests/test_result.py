"""The ``--json`` object is derived from :class:`RunResult`'s fields, and its totals say
whether they include the warm-up."""

from __future__ import annotations

import dataclasses

import pytest

from analysis.resolve import build_config
from simcore.engine import simulate
from simcore.result import CONTRACT_KEYS, RunResult
from simcore.spec import RunSpec


@pytest.fixture(scope="module")
def result() -> RunResult:
    return simulate(
        build_config(
            RunSpec(gpus=4, model="resnet18", iterations=2, warmup_iterations=1), record_spans=True
        )
    )


def test_json_has_every_field_but_the_spans(result):
    d = result.to_dict()
    names = [f.name for f in dataclasses.fields(RunResult) if f.name not in ("spans", "extra")]
    assert list(d)[: len(names)] == names
    assert set(CONTRACT_KEYS) <= set(d)
    assert "spans" not in d and result.spans


def test_json_values_are_plain_data(result):
    d = result.to_dict()
    assert isinstance(d["per_gpu_utilization"], list)
    assert isinstance(d["comm_bytes_by_link_kind"], dict)
    assert isinstance(d["device_names"], list)
    assert d["fits_in_memory"] is (result.peak_memory_bytes <= result.memory_capacity_bytes)


def test_totals_say_whether_they_include_the_warm_up(result):
    # one warm-up and two measured iterations of the same all-reduces
    assert result.comm_bytes_measured == pytest.approx(2 / 3 * result.comm_bytes_total, rel=1e-6)
    assert result.comm_bytes_per_iteration * 2 == pytest.approx(result.comm_bytes_measured)
    assert sum(result.comm_bytes_by_link_kind.values()) >= result.comm_bytes_total
