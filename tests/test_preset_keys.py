"""The machine sections of a topology preset declared once (``simcore.preset_keys``): every
key parsed into its spec and checked against its limits, older names read as aliases,
unknown keys named with the known ones, and what the calibration writes read back."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import yaml

from simcore.preset_keys import (
    KEYS,
    SECTIONS,
    PresetKey,
    canonical,
    canonical_path,
    keys_of,
    section_values,
    written,
)
from simcore.settings import ConfigError
from simcore.topology import (
    GlooSpec,
    GpuSpec,
    HostSpec,
    NetworkSpec,
    NicLinkSpec,
    TopologyError,
    TopologySpec,
    parse_sections,
)

HERE = os.path.dirname(__file__)
CALIBRATED = os.path.join(HERE, "data", "calibrated-1Gbps.yaml")
SEED = os.path.join(HERE, "..", "docs", "data", "emulated-seed-2026-11-28", "calib-100Mbps.yaml")
SPECS = {
    "gpu": GpuSpec,
    "host": HostSpec,
    "gloo": GlooSpec,
    "network": NetworkSpec,
    "network.nic_link": NicLinkSpec,
}
VALUES = {
    "int": (3, 3),
    "bool": ("no", False),
    "float": ("0.5", 0.5),
    "seconds": ("2ms", 2e-3),
    "bytes": ("2KiB", 2048),
    "rate": ("8Gbps", 1e9),
}
"""A value of each kind as a file may write it, and the typed value it stands for."""


def a_value(key: PresetKey) -> tuple[Any, Any]:
    if key.choices is not None:
        return key.choices[-1], key.choices[-1]
    if key.kind == "str":
        return "Z9", "Z9"
    if key.kind == "section":
        return {"latency": "1ms"}, NicLinkSpec(latency_s=1e-3)
    return VALUES[key.kind]


def preset_with(section: str, name: str, value: Any) -> dict[str, Any]:
    """A preset whose ``section`` sets ``name`` to ``value``."""
    if section == "network.nic_link":
        return {"network": {"nic_link": {name: value}}}
    return {section: {name: value}}


def spec_of(sections: Any, section: str) -> Any:
    if section == "network.nic_link":
        return sections.network.nic_link
    return getattr(sections, section)


def test_every_section_declares_exactly_its_specs_fields() -> None:
    for section in SECTIONS:
        names = [k.name for k in keys_of(section)]
        assert names == [f.name for f in dataclasses.fields(SPECS[section])], section
    assert {k.section for k in KEYS} == set(SECTIONS)


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.path)
def test_every_key_is_parsed_into_its_specs_field(key: PresetKey) -> None:
    text, typed = a_value(key)
    sections = parse_sections(preset_with(key.section, key.name, text))
    assert getattr(spec_of(sections, key.section), key.name) == typed


def _bad_values(key: PresetKey) -> list[Any]:
    """Values outside ``key``'s limits or of another kind."""
    bad: list[Any] = [{"a": 1}] if key.kind != "section" else [3]
    if key.choices is not None:
        bad.append("nope")
    if key.minimum is not None:
        bad.append(key.minimum - 1)
    if key.positive:
        bad.append(0 if key.auto is None else -1)
    if key.maximum is not None:
        bad.append(key.maximum + 0.5)
    if key.below is not None:
        bad.append(key.below)
    if key.kind in ("seconds", "bytes", "rate"):
        bad.append(-1)
    if key.kind in ("int", "float"):
        bad.append("many")
    return bad


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.path)
def test_every_key_refuses_what_it_does_not_allow_naming_itself_and_the_value(
    key: PresetKey,
) -> None:
    for value in _bad_values(key):
        with pytest.raises(ConfigError) as err:
            parse_sections(preset_with(key.section, key.name, value))
        message = str(err.value)
        assert message.startswith(f"{key.path}: {value!r} is not allowed; "), message
        assert "\n" not in message and len(message) > len(key.path) + 25


def test_limits_are_the_declared_ones() -> None:
    """The limits that keep the simulator's arithmetic sound, checked where a file is
    read: a host has a core, a flow gets some of its link and at most all of it."""
    by_path = {k.path: k for k in KEYS}
    assert by_path["host.cores"].minimum == 1
    assert by_path["gloo.segment_bytes"].positive and by_path["gloo.threads"].minimum == 1
    flow = by_path["network.flow_share"]
    assert flow.positive and flow.maximum == 1 and flow.limits == "> 0, <= 1"
    assert by_path["network.flow_spread"].limits == ">= 0, < 1"
    assert by_path["network.sharing"].limits == "fifo, fair"
    assert by_path["host.wakeup_s"].limits == ">= 0"
    parse_sections(preset_with("network", "flow_share", 1))  # at most: 1 itself is allowed


@pytest.mark.parametrize("key", [k for k in KEYS if k.aliases], ids=lambda k: k.path)
def test_an_older_name_is_read_as_its_key(key: PresetKey) -> None:
    text, typed = a_value(key)
    (alias,) = key.aliases
    older = parse_sections(preset_with(key.section, alias, text))
    assert getattr(spec_of(older, key.section), key.name) == typed
    assert older == parse_sections(preset_with(key.section, key.name, text))
    both = preset_with(key.section, key.name, text)
    if key.section == "network.nic_link":
        both["network"]["nic_link"][alias] = text
    else:
        both[key.section][alias] = text
    with pytest.raises(ConfigError, match=f"{key.section}.{alias}: .* is the same key"):
        parse_sections(both)


def test_an_unknown_key_is_named_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        section_values("host", {"cores": 2, "speed": 3})
    names = ", ".join(k.name for k in keys_of("host"))
    assert str(err.value) == f"host.speed: unknown setting; known: {names}"
    with pytest.raises(ConfigError, match=r"^network\.nic_link\.rate: unknown setting; known"):
        parse_sections({"network": {"nic_link": {"rate": "1GB/s"}}})
    with pytest.raises(ConfigError, match=r"^gloo: 3 is not allowed; expected a mapping"):
        parse_sections({"gloo": 3})


def test_a_preset_without_machine_sections_gets_the_specs_defaults() -> None:
    sections = parse_sections({"box": {"gpus": 1}})
    assert sections.gpu == GpuSpec() and sections.network == NetworkSpec()
    assert sections.host is None and sections.gloo is None
    assert parse_sections({"host": {}, "gloo": None}).host is None


def test_a_topology_spec_names_its_preset_and_the_bad_key() -> None:
    bad = {"name": "mine", "box": {"gpus": 1}, "network": {"lead": "-2ms"}}
    with pytest.raises(TopologyError, match=r"^preset 'mine': network\.lead: '-2ms' is not"):
        TopologySpec(bad, 2)
    spec = TopologySpec({"name": "ok", "network": {"lead": "2ms"}}, 2)
    assert spec.sections.network.lead_s == 2e-3
    moved = dataclasses.replace(spec, preset={"network": {"lead_s": "3ms"}})
    assert moved.sections.network.lead_s == 3e-3  # parsed again with the new preset


def test_a_bad_key_in_a_file_is_one_line_naming_the_file(tmp_path: Any, capsys: Any) -> None:
    from analysis.resolve import load_preset
    from dtsim.cli import main

    with open(CALIBRATED, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    preset["host"]["wakeup_s"] = -1e-3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(preset), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_preset(str(path))
    assert str(err.value).startswith(f"{path}: host.wakeup_s: -0.001 is not allowed; ")
    with pytest.raises(SystemExit) as ex:
        main(["run", "--topology", str(path), "--gpus", "2"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert ex.value.code == 2 and len(lines) == 1 and lines[0].endswith(str(err.value))


def test_canonical_renames_older_names_and_keeps_every_value() -> None:
    with open(SEED, encoding="utf-8") as fh:
        old = yaml.safe_load(fh)
    new = canonical(old)
    assert new["host"]["socket_buffer_bytes"] == old["host"]["socket_buffer"]
    assert new["network"]["lead_s"] == old["network"]["lead"]
    assert new["network"]["nic_link"] == {
        "kind": "pcie",
        "bandwidth_bytes_per_s": old["network"]["nic_link"]["bandwidth"],
        "latency_s": old["network"]["nic_link"]["latency"],
    }
    sources = new["measured"]["sources"]
    assert sources["gpu.peak_flop_per_s"] == old["measured"]["sources"]["gpu.peak_flops"]
    assert "gpu.peak_flops" not in sources and len(sources) == len(old["measured"]["sources"])
    assert parse_sections(new) == parse_sections(old)
    assert new["box"] is old["box"] and canonical(new) == new
    assert list(new) == list(old)  # sections in their order
    assert canonical_path("network.nic_link.latency") == "network.nic_link.latency_s"
    assert canonical_path("box.gpus") == "box.gpus"


def test_the_writer_lays_out_field_names_in_declaration_order_and_refuses_others() -> None:
    laid = written({"host": {"wakeup_s": 1e-3, "cores": 2}, "box": {"gpus": 1}})
    assert list(laid["host"]) == ["cores", "wakeup_s"] and laid["box"] == {"gpus": 1}
    with pytest.raises(ConfigError, match=r"^host\.socket_buffer: .* names it host\.socket_"):
        written({"host": {"socket_buffer": "1MB"}})
    with pytest.raises(ConfigError, match=r"^host\.speed: unknown setting"):
        written({"host": {"speed": 1}})
    with pytest.raises(ConfigError, match=r"^network\.flow_share: 1\.5 is not allowed"):
        written({"network": {"flow_share": 1.5}})


def test_a_written_calibration_reads_back_to_the_same_specs(tmp_path: Any) -> None:
    """``sim calibrate``'s writer (``write_calibration``) writes every machine key by its
    field name; the reader gives the specs of the file it came from, and a what-if at
    another rate moves the same keys in either file."""
    from realrun.calibrated import at_rate
    from realrun.calibration.preset import write_calibration

    with open(SEED, encoding="utf-8") as fh:
        old = yaml.safe_load(fh)
    path = tmp_path / "again.yaml"
    write_calibration(old, str(path))
    with open(path, encoding="utf-8") as fh:
        again = yaml.safe_load(fh)
    for section in ("gpu", "host", "gloo", "network"):
        names = [k.name for k in keys_of(section)]
        assert list(again[section]) == [n for n in names if n in again[section]], section
    assert parse_sections(again) == parse_sections(old)
    assert again["measured"]["sources"] == canonical(old)["measured"]["sources"]
    assert parse_sections(at_rate(again, 25e6)) == parse_sections(at_rate(old, 25e6))
