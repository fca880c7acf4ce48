"""Defaults that work: the main job as ``make demo`` runs it fits the default GPU, and a
real run with no flags starts as many ranks as the machine has cores for."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dtsim.cli import cli
from realrun.spec import MAX_DEFAULT_WORKERS, default_workers
from simcore.spec import DEFAULT_MODEL_BATCH


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_main_job_fits_the_default_gpu():
    out = invoke("run", "--gpus", "8", "--scheme", "p3")
    assert f"batch {DEFAULT_MODEL_BATCH} per replica" in out
    memory = next(line for line in out.splitlines() if "peak memory" in line)
    assert memory.rstrip().endswith("(fits)"), memory


def test_a_model_named_keeps_its_traces_batch():
    d = json.loads(
        invoke("run", "--gpus", "1", "--model", "resnet50", "--iterations", "1", "--json")
    )
    assert d["batch_size"] == 128 and d["model"] == "resnet50"
    d = json.loads(invoke("run", "--gpus", "1", "--iterations", "1", "--json"))
    assert d["batch_size"] == DEFAULT_MODEL_BATCH and d["model"] == "resnet50"


def test_the_help_says_why_the_default_batch_is_what_it_is():
    out = " ".join(invoke("run", "--help").split())
    assert f"{DEFAULT_MODEL_BATCH} for the default model" in out
    assert "does not fit a 16 GiB V100" in out


@pytest.mark.parametrize(
    ("cores", "workers"), [(1, 2), (2, 2), (3, 2), (4, 4), (6, 4), (8, 8), (64, 8)]
)
def test_real_runs_default_to_a_rank_per_core(cores, workers):
    assert default_workers(cores) == workers
    assert default_workers(cores) <= MAX_DEFAULT_WORKERS


def test_sim_real_without_flags_plans_the_default_ranks(tmp_path):
    job_file = tmp_path / "job.json"
    result = CliRunner().invoke(cli, ["real", "--write-job", str(job_file)])
    assert result.exit_code == 0, result.output
    job = json.loads(job_file.read_text())
    assert job["workers"] == default_workers()
    assert job["scheme"] == "dp" and job["model"] == "resnet18"
