"""Adding a scheme is one module: a data-parallel and a pipeline scheme written into a
temporary module each show up in ``sim schemes``, ``sim run``, ``sim schedule`` (the
pipeline) and the report, with no edit anywhere else. A scheme with a real runtime of its
own is two modules, the scheme's and the runtime's: ``sim real`` runs it for real."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

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

REAL_MODULE = '''
"""A scheme for the test: data parallelism run for real by a runtime of its own."""
from simcore.schemes.dp import DataParallel


class Zzreal(DataParallel):
    name = "zzreal"
    summary = "test scheme: data parallelism with the test's own real runtime"
    real_runtime = "zzreal_runtime:ZzrealRuntime"
'''

REAL_RUNTIME_MODULE = '''
"""The test's real runtime: after backward every worker all-reduces its gradients, takes
their mean and steps, and counts its steps in its record."""
import torch.distributed as dist

from realrun.runtime import make_optimizer
from realrun.schemes.base import WorkerLoop


class ZzrealRuntime(WorkerLoop):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.optimizer = make_optimizer(self.job, list(self.setup.model.parameters()))

    def after_backward(self, it):
        for p in self.setup.model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.ctx.group)
                p.grad /= self.job.workers
        self.optimizer.step()
        self.ctx.extra["zzreal_steps"] = it + 1
'''

SITE_MODULE = '''
"""Every process started with this folder on PYTHONPATH (``sim real`` and its ranks) finds
the test's schemes, as the ``new_schemes`` fixture makes the test's own process find them."""
import simcore.scheme_names
import simcore.schemes

simcore.schemes.__path__.append({folder!r})
simcore.scheme_names.SCHEME_PATHS.append({folder!r})
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


def test_a_subclass_does_not_take_over_its_bases_convergence_runs(new_schemes):
    # zzdp is a DataParallel subclass: sim train's "dp" stays dp, and zzdp has no runs
    import analysis.convergence as convergence

    convergence._study.cache_clear()
    try:
        assert convergence.scheme_of("dp") == ("dp", {})
        assert "zzdp" not in {real for real, _ in convergence._study().values()}
    finally:
        convergence._study.cache_clear()


@pytest.mark.real
@pytest.mark.parametrize("scheme", ["zzreal", "zzpipe"])
def test_sim_real_runs_them_for_real(tmp_path, scheme):
    """``zzreal`` names its own runtime (a module of its own), ``zzpipe`` inherits the
    pipelines' one; ``sim real`` (a process of its own, as a user starts it) runs either on
    two gloo ranks with no edit anywhere else."""
    pytest.importorskip("torch", reason="real runs need torch (make test installs it)")
    folders = {name: tmp_path / name for name in ("schemes", "runtimes", "site")}
    for folder in folders.values():
        folder.mkdir()
    for name, text in (("zzdp", DP_MODULE), ("zzpipe", PIPE_MODULE), ("zzreal", REAL_MODULE)):
        (folders["schemes"] / f"{name}.py").write_text(textwrap.dedent(text))
    (folders["runtimes"] / "zzreal_runtime.py").write_text(textwrap.dedent(REAL_RUNTIME_MODULE))
    site = SITE_MODULE.format(folder=str(folders["schemes"]))
    (folders["site"] / "sitecustomize.py").write_text(textwrap.dedent(site))
    root = str(Path(__file__).resolve().parent.parent)
    path = [str(folders["site"]), str(folders["runtimes"]), root, os.environ.get("PYTHONPATH", "")]
    keep = tmp_path / "keep"
    out = subprocess.run(
        [
            str(Path(sys.executable).parent / "sim"),
            "real",
            "--scheme",
            scheme,
            "--gpus",
            "2",
            "--model",
            "mlp_small",
            "--iterations",
            "2",
            "--json",
            "--keep",
            str(keep),
        ],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["scheme"] == scheme and result["gpus"] == 2 and result["iteration_time_s"] > 0
    ranks = json.loads((keep / "records.json").read_text())["ranks"]
    if scheme == "zzreal":  # the test's runtime took every step (one warm-up, two measured)
        assert [r["zzreal_steps"] for r in ranks] == [3, 3]
    else:  # the pipelines' runtime ran the scheme's schedule on its declared micro-batches
        assert result["microbatches"] == 2 * 2 and result["stage_replicas"] == [1, 1]
