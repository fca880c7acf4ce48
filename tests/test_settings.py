"""One declaration of the run settings (:class:`simcore.spec.RunSpec`): a flag, a config
file and ``--set`` give the same spec and the same simulator config for every key; the
simulator config shares the declaration; a subclass adds settings (as the real runs do)."""

from __future__ import annotations

import dataclasses
import json

import click
import pytest
from click.testing import CliRunner

from analysis.resolve import build_config
from dtsim.cli.options import run_options, spec_from_params
from simcore.config import SHARED, RunSettings, SimConfig
from simcore.settings import ConfigError, setting
from simcore.spec import FIELDS, FLAG_FIELDS, RunSpec, apply_settings

VALUES = {
    "scheme": "ps",
    "gpus": "4",
    "model": "vgg16",
    "topology": "ethernet",
    "bandwidth": "25Gbps",
    "batch_size": "32",
    "iterations": "3",
    "warmup_iterations": "2",
    "seed": "7",
    "fidelity": "analytic",
    "chunk_bytes": "4MiB",
    "compute_jitter": "0.25",
    "compute_scale": "2",
    "optimizer": "adam",
    "nic_per_gpu": "true",
}
"""A value other than the default for every run setting, as a person types it."""


def test_every_setting_has_a_test_value():
    assert set(VALUES) == set(FIELDS) - {"scheme_options"}


def resolve(args: list[str], spec_cls: type = RunSpec) -> tuple[RunSpec, SimConfig | None]:
    """The spec and config a ``sim run``-like command makes of ``args``."""

    @click.command()
    @click.pass_context
    def cmd(ctx: click.Context, **params):
        spec = spec_from_params(ctx, params, spec_cls)
        return spec, (build_config(spec) if spec_cls is RunSpec else None)

    cmd = run_options(cmd, spec_cls)
    result = CliRunner().invoke(cmd, args, standalone_mode=False, catch_exceptions=False)
    return result.return_value


@pytest.mark.parametrize("key", sorted(VALUES))
def test_flag_config_file_and_set_give_the_same_config(tmp_path, key):
    value = VALUES[key]
    default_spec, default_config = resolve([])
    ways = {"--set": ["--set", f"{key}={value}"]}
    if key in FLAG_FIELDS:
        ways["flag"] = ["--" + key.replace("_", "-"), value]
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"{key}: {value}\n")
    ways["yaml"] = ["--config", str(yaml_file)]
    json_file = tmp_path / "c.json"
    json_file.write_text(json.dumps({key: value}))
    ways["json"] = ["--config", str(json_file)]
    got = {way: resolve(args) for way, args in ways.items()}
    specs = {way: s for way, (s, _c) in got.items()}
    configs = {way: c for way, (_s, c) in got.items()}
    first = next(iter(specs.values()))
    assert all(s == first for s in specs.values()), specs
    assert first != default_spec
    assert getattr(first, key) == apply_settings(RunSpec(), {key: value}).__getattribute__(key)
    first_config = next(iter(configs.values()))
    assert all(c == first_config for c in configs.values())
    if key in SHARED:  # the simulator reads the same value under the same name
        assert getattr(first_config, key) == getattr(first, key)
        assert getattr(first_config, key) != getattr(default_config, key)


def test_all_settings_at_once_agree_across_the_three_ways(tmp_path):
    settings = [a for k, v in VALUES.items() for a in ("--set", f"{k}={v}")]
    flags = [a for k in FLAG_FIELDS for a in ("--" + k.replace("_", "-"), VALUES[k])]
    others = [a for k, v in VALUES.items() if k not in FLAG_FIELDS for a in ("--set", f"{k}={v}")]
    f = tmp_path / "all.yaml"
    f.write_text("".join(f"{k}: {v}\n" for k, v in VALUES.items()))
    a, b, c = resolve(settings), resolve(flags + others), resolve(["--config", str(f)])
    assert a == b == c


def test_precedence_defaults_then_file_then_flags_then_set(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpus: 2\nseed: 3\niterations: 4\n")
    spec, _ = resolve(["--config", str(f), "--seed", "5", "--set", "iterations=6"])
    assert (spec.gpus, spec.seed, spec.iterations) == (2, 5, 6)


def test_simconfig_shares_the_declaration():
    run_fields = {f.name: f for f in dataclasses.fields(RunSettings)}
    for cls in (SimConfig, RunSpec):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, f in run_fields.items():
            assert fields[name].default == f.default and fields[name].metadata == f.metadata


def test_values_are_typed_once_whatever_they_were_typed_in():
    spec = RunSpec(chunk_bytes="4MiB", bandwidth="8Gbps", gpus="4", compute_scale=0)
    assert spec == RunSpec(chunk_bytes=4 << 20, bandwidth=1e9, gpus=4)
    assert spec.compute_scale is None and spec.bandwidth == 1e9
    with pytest.raises(ConfigError, match="chunk_bytes: 100 is not allowed"):
        RunSpec(chunk_bytes=100)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RealSpec(RunSpec):
    """How the real runs add a setting of their own."""

    backend: str = setting("gloo", "collective backend", choices=("gloo", "nccl"), flag=20)


def test_a_subclass_adds_a_setting_with_its_flag_file_key_and_set(tmp_path):
    assert resolve(["--backend", "nccl"], RealSpec)[0].backend == "nccl"
    assert resolve(["--set", "backend=nccl"], RealSpec)[0].backend == "nccl"
    f = tmp_path / "c.yaml"
    f.write_text("backend: nccl\ngpus: 2\n")
    spec, _ = resolve(["--config", str(f)], RealSpec)
    assert (spec.backend, spec.gpus) == ("nccl", 2)
    with pytest.raises(ConfigError, match="backend: 'mpi' is not allowed; choose one of"):
        resolve(["--set", "backend=mpi"], RealSpec)
