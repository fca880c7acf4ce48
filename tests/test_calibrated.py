"""A calibrated topology file moved to another link rate (``realrun.calibrated``), and
``sim run --bandwidth`` on one.

``tests/data/calibrated-1Gbps.yaml`` is what ``sim calibrate --cluster netns --bandwidth
1Gbps`` wrote on this machine type (2026-11-28)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.resolve import build_config, preset_at_rate
from realrun.calibrated import (
    at_rate,
    burst_payload_bytes,
    calibrated_rate,
    goodput_share,
    is_calibrated,
)
from simcore.engine import simulate
from simcore.preset_keys import KEYS, SOURCES, canonical
from simcore.spec import RunSpec
from simcore.topology import parse_sections
from simcore.units import parse_rate, parse_size

CALIBRATED = os.path.join(os.path.dirname(__file__), "data", "calibrated-1Gbps.yaml")
GBPS = 125e6


@pytest.fixture(scope="module")
def preset() -> dict[str, Any]:
    with open(CALIBRATED, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_a_calibration_knows_its_rate_and_goodput_share(preset: dict) -> None:
    assert is_calibrated(preset)
    assert calibrated_rate(preset) == GBPS
    share, source = goodput_share(preset)
    assert share == preset["measured"]["fits"]["goodput_share_of_tbf_rate"]
    assert source == "calibration:shaped ping-pong"
    assert not is_calibrated({"name": "netns", "box": {"gpus": 1}})


def test_at_its_own_rate_the_links_are_as_measured(preset: dict) -> None:
    """The moved copy names its keys by their fields, the values as measured."""
    moved = at_rate(preset, GBPS)
    assert parse_sections(moved) == parse_sections(preset)
    assert moved["network"]["bandwidth_bytes_per_s"] == preset["network"]["bandwidth"]
    assert moved["network"]["burst_bytes"] == preset["network"]["burst"]
    assert moved["host"] == canonical(preset)["host"]


@settings(max_examples=25, deadline=None)
@given(rate=st.floats(min_value=1e6, max_value=1.25e9))
def test_another_rate_keeps_the_share_and_the_hosts(rate: float) -> None:
    """Goodput = rate x the measured share (4 significant digits, as written); the
    bucket is the one ``sim real`` shapes at that rate; everything measured of the hosts
    is kept, and the file says what it was moved from."""
    with open(CALIBRATED, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    before = copy.deepcopy(preset)
    moved = at_rate(preset, rate)
    assert preset == before  # the input is not changed
    share = preset["measured"]["fits"]["goodput_share_of_tbf_rate"]
    network = moved["network"]
    assert parse_rate(network["bandwidth_bytes_per_s"]) == pytest.approx(rate * share, rel=1e-3)
    assert parse_size(network["burst_bytes"]) == round(burst_payload_bytes(rate))
    for key in ("latency_s", "peak_bandwidth_bytes_per_s", "lead_s", "sharing"):
        assert network[key] == canonical(preset)["network"][key]
    assert moved["host"] == canonical(preset)["host"]
    assert moved["measured"]["moved_from"]["tbf_rate"] == preset["measured"]["tbf_rate"]
    assert calibrated_rate(moved) == pytest.approx(rate, rel=1e-3)


def test_at_rate_refuses_what_it_cannot_move(preset: dict) -> None:
    with pytest.raises(ValueError, match="not a calibrated preset"):
        at_rate({"name": "ethernet", "box": {"gpus": 1}}, GBPS)
    with pytest.raises(ValueError, match="positive"):
        at_rate(preset, 0.0)


def _iteration_s(bandwidth: float | None) -> float:
    spec = RunSpec().replace(
        scheme="dp", gpus=2, model="resnet18-cpu", topology=CALIBRATED, iterations=2
    )
    if bandwidth is not None:
        spec = spec.replace(bandwidth=bandwidth)
    return simulate(build_config(spec, record_spans=False)).iteration_time_s


def test_sim_run_at_the_calibrated_rate_is_the_calibration_itself() -> None:
    """``--bandwidth`` equal to the rate a file was calibrated at changes nothing (it used
    to replace the measured goodput by the nominal rate, 5% faster); lower rates are
    slower."""
    as_measured = _iteration_s(None)
    assert _iteration_s(GBPS) == as_measured
    assert _iteration_s(GBPS / 5) > _iteration_s(GBPS / 2) > as_measured


def test_other_presets_take_the_rate_as_an_override() -> None:
    plain = {"name": "ethernet", "box": {"gpus": 1}}
    assert preset_at_rate(plain, 5e8) == (plain, 5e8)
    assert preset_at_rate(plain, None) == (plain, None)


# ---- every setting declared once, with its source --------------------------------------

IDENTITIES = {"gpu.kind", "gpu.model", "network.kind", "network.nic_link"}
"""Keys of a calibrated file that say what the devices are, not how fast: no knobs."""


def test_every_setting_of_a_calibrated_file_is_declared(preset: dict) -> None:
    from realrun.calibrated import KNOBS

    declared = {k.path for k in KNOBS}
    for section in ("gpu", "host", "gloo", "network"):
        for key in canonical(preset)[section]:
            path = f"{section}.{key}"
            assert path in declared or path in IDENTITIES, f"{path} has no declared source"
    top = {k.path for k in KEYS if k.source is None and k.section != "network.nic_link"}
    assert top == IDENTITIES  # every other key of the four sections has a source
    assert all(k.source.split(":")[0] in SOURCES for k in KNOBS)
    assert len(declared) == len(KNOBS)


def test_the_docs_table_is_the_declarations() -> None:
    """docs/prediction.md holds :func:`knob_table` as it is, between its heading and the
    next blank line: a key declared, renamed or given another source shows there."""
    from realrun.calibrated import knob_table

    docs = os.path.join(os.path.dirname(__file__), "..", "docs", "prediction.md")
    with open(docs, encoding="utf-8") as fh:
        text = fh.read()
    start = text.index("| setting | unit | source |")
    end = text.find("\n\n", start)
    assert text[start : end if end >= 0 else len(text)].rstrip("\n") == knob_table()


def test_a_case_preset_says_what_came_from_the_profile_and_what_from_the_run(
    tmp_path: Any,
) -> None:
    from analysis.resolve import load_preset
    from analysis.validation.inputs import case_topology

    trace = str(tmp_path / "t.json")
    update = {"memory_bandwidth_bytes_per_s": 5e9, "step_overhead_s": 1e-4}
    predicted = load_preset(case_topology(str(tmp_path), CALIBRATED, trace, update))
    sources = predicted["measured"]["sources"]
    assert sources["gpu.step_overhead_s"] == "profile" and "host.isend_s" not in sources
    assert sources["network.lead_s"] == "fit-by-simulation:two flows"
    assert "network.lead" not in sources  # the file's older names, renamed
    replayed = load_preset(
        case_topology(
            str(tmp_path),
            CALIBRATED,
            str(tmp_path / "r.json"),
            {**update, "isend_s": 1e-5},
            source="run",
        )
    )
    assert replayed["measured"]["sources"]["gpu.step_overhead_s"] == "run"
    assert replayed["measured"]["sources"]["host.isend_s"] == "run"
