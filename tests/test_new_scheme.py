"""Adding a scheme is one module: a data-parallel and a pipeline scheme written into a
temporary module each show up in ``sim schemes``, ``sim run``, ``sim schedule`` (the
pipeline) and the report, with no edit anywhere else."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import pytest
from click.testing import CliRunner

import simcore.scheme_names
import simcore.schemes
from dtsim.cli import cli

DP_MODULE = '''
"""A data-parallel scheme for the test: DDP with small buckets."""
from dataclasses import dataclass

from simcore.config import option
from simcore.schemes.dp import DataParallel, DPOptions


@dataclass(frozen=True)
class ZzdpOptions(DPOptions):
    bucket_bytes: int = option(1 << 20, "gradient bucket size", unit="bytes")


class Zzdp(DataParallel):
    name = "zzdp"
    summary = "test scheme: data parallelism with 1 MiB buckets"
    Options = ZzdpOptions
'''

PIPE_MODULE = '''
"""A pipeline scheme for the test: GPipe with two micro-batches per stage."""
from simcore.schedule import gpipe
from simcore.schemes._pipeline import MicrobatchOptions, PipelineFeatures, PipelineScheme


class Zzpipe(PipelineScheme):
    name = "zzpipe"
    summary = "test scheme: a flushed pipeline, two micro-batches per stage"
    Options = MicrobatchOptions
    features = PipelineFeatures(microbatches_per_stage=2)

    @classmethod
    def make_schedule(cls, stages, microbatches, iterations, options):
        return gpipe(stages, microbatches, iterations, name="zzpipe")
'''

SMALL = ["--gpus", "2", "--model", "alexnet", "--iterations", "1"]


def _clear_caches() -> None:
    simcore.schemes.scheme_names.cache_clear()
    simcore.schemes.get_scheme.cache_clear()


@pytest.fixture
def new_schemes(tmp_path, monkeypatch):
    (tmp_path / "zzdp.py").write_text(textwrap.dedent(DP_MODULE))
    (tmp_path / "zzpipe.py").write_text(textwrap.dedent(PIPE_MODULE))
    monkeypatch.setattr(simcore.schemes, "__path__", [*simcore.schemes.__path__, str(tmp_path)])
    monkeypatch.setattr(
        simcore.scheme_names, "SCHEME_PATHS", [*simcore.scheme_names.SCHEME_PATHS, str(tmp_path)]
    )
    _clear_caches()
    yield ("zzdp", "zzpipe")
    _clear_caches()
    for name in ("zzdp", "zzpipe"):
        sys.modules.pop(f"simcore.schemes.{name}", None)


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_sim_schemes_lists_them_with_their_options(new_schemes):
    out = invoke("schemes", "-v")
    assert "zzdp " in out and "1 MiB buckets" in out
    assert "zzpipe " in out and "two micro-batches per stage" in out
    assert "zzdp options" in out and "[default: 1048576]" in out


@pytest.mark.parametrize("scheme", ["zzdp", "zzpipe"])
def test_sim_run_runs_them(new_schemes, scheme):
    d = json.loads(invoke("run", "--scheme", scheme, *SMALL, "--json"))
    assert d["scheme"] == scheme and d["iteration_time_s"] > 0
    assert scheme in invoke("run", "--help")


def test_the_pipeline_features_are_the_declared_ones(new_schemes):
    d = json.loads(invoke("run", "--scheme", "zzpipe", *SMALL, "--json"))
    assert d["microbatches"] == 2 * 2  # two per stage, two stages


def test_sim_schedule_shows_the_pipeline_and_only_pipelines(new_schemes):
    out = invoke("schedule", "--scheme", "zzpipe", "--stages", "2", "--microbatches", "2")
    assert out.startswith("zzpipe: 2 stages") and "valid" in out
    bad = CliRunner().invoke(cli, ["schedule", "--scheme", "zzdp"])
    assert bad.exit_code == 2 and "'zzdp' is not one of" in bad.output


def test_the_report_includes_them(new_schemes, tmp_path):
    from analysis.report import run_section, sections

    secs = {s.key: s for s in sections()}
    assert {"zzdp", "zzpipe"} <= set(secs["all-schemes"].schemes)
    assert "zzpipe" in secs["pipelines-vs-dp"].schemes
    overview = dataclasses.replace(
        secs["all-schemes"],
        schemes=new_schemes,
        base={**secs["all-schemes"].base, "gpus": 2, "model": "alexnet"},
    )
    text, missing, computed = run_section(
        overview, str(tmp_path / "report"), quick=True, jobs=1, progress=False
    )
    assert computed == 2 and not missing
    assert "| zzdp" in text and "| zzpipe" in text
