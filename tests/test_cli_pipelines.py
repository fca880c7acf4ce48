"""``sim partition``, ``sim schedule`` and ``sim run`` with pipeline schemes, as a user
drives them."""

from __future__ import annotations

import json
import re

import pytest

from simcore.result import CONTRACT_KEYS
from tests.test_cli import run_main


def test_partition_prints_stages_bottleneck_and_speedups(capsys):
    code, out, err = run_main(
        capsys, "partition", "--model", "vgg16", "--gpus", "4", "--topology", "ethernet"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == (
        "antichain partition of vgg16 over 4 GPUs (replicated stages allowed) at 10 Gbps, batch 128"
    )
    assert lines[2].split()[:3] == ["0", "node1..node16", "(16)"]
    assert lines[2].split()[3] == "3"  # replicas of stage 0
    assert "bottleneck  174.5 ms per batch" in out
    assert "3.85x over 1 GPU" in out and "2.87x over data parallelism" in out


def test_partition_json_has_the_promised_keys(capsys):
    code, out, _ = run_main(
        capsys, "partition", "--model", "resnet50", "--gpus", "8", "--straight", "--json"
    )
    assert code == 0
    d = json.loads(out)
    for key in ("stages", "bottleneck_s", "speedup_vs_1gpu", "speedup_vs_dp", "wall_s"):
        assert key in d
    assert len(d["stages"]) == 8
    for s in d["stages"]:
        assert {"layers", "replicas", "compute_s"} <= set(s) and s["replicas"] == 1
    assert d["bottleneck_s"] == pytest.approx(0.05668399999999999, rel=1e-9)
    layers = [name for s in d["stages"] for name in s["layers"]]
    assert len(layers) == len(set(layers)) == 177


def test_partition_cuts_for_the_bandwidth_sim_runs_pipelines_use(capsys):
    from analysis.resolve import load_preset
    from simcore.topology import TopologySpec, build_topology
    from simcore.units import format_rate

    pcie = build_topology(TopologySpec(preset=load_preset("pcie"), gpus=4)).stage_bandwidth()
    _, by_default, _ = run_main(capsys, "partition", "--model", "vgg16", "--gpus", "4")
    assert f"at {format_rate(pcie)}, batch 128" in by_default.splitlines()[0]
    _, given, _ = run_main(
        capsys, "partition", "--model", "vgg16", "--gpus", "4", "--bandwidth", "10Gbps"
    )
    assert "at 10 Gbps, batch 128" in given.splitlines()[0]
    _, defaults, _ = run_main(capsys, "partition", "--json")  # sim run's model and GPUs
    d = json.loads(defaults)
    assert sum(s["replicas"] for s in d["stages"]) <= 8 and len(d["stages"]) > 1


@pytest.mark.parametrize("method", ["layers", "params", "compute"])
def test_partition_baselines_are_never_better(capsys, method):
    _, best, _ = run_main(
        capsys, "partition", "--model", "resnet18", "--gpus", "4", "--straight", "--json"
    )
    code, out, _ = run_main(
        capsys, "partition", "--model", "resnet18", "--gpus", "4", "--method", method, "--json"
    )
    assert code == 0
    assert json.loads(out)["bottleneck_s"] >= json.loads(best)["bottleneck_s"]
    assert json.loads(out)["method"] == method


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "alexnet", "--gpus", "30", "--straight"], "fewer layers than stages"),
        (["--model", "vgg16", "--bandwidth", "fast"], "--bandwidth: 'fast' is not allowed"),
        (["--model", "vgg16", "--memory-limit", "1GiB"], "within the memory limit"),
        (["--model", "nonesuch"], "--model: 'nonesuch' is not allowed"),
        (["--gpus", "0"], "--gpus: 0 is not allowed"),
        (["--topology", "nonesuch"], "--topology: 'nonesuch'"),
    ],
)
def test_partition_errors_are_one_line(capsys, args, message):
    code, out, err = run_main(capsys, "partition", *args)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_schedule_prints_the_grid(capsys):
    code, out, err = run_main(
        capsys, "schedule", "--scheme", "pipedream", "--stages", "4", "--microbatches", "8"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "pipedream: 4 stages (1+1+1+1 GPUs), 8 micro-batches, valid"
    assert lines[2].split()[1:9] == ["F0", "F1", "F2", "F3", ".", ".", ".", "B0"]
    assert lines[5].split()[1:5] == [".", ".", ".", "F0"]


def test_schedule_options_and_action_lists(capsys, tmp_path):
    code, out, _ = run_main(
        capsys,
        "schedule",
        "--scheme",
        "gpipe",
        "--stages",
        "2",
        "--microbatches",
        "2",
        "--set",
        "recompute=true",
        "--actions",
    )
    assert code == 0
    assert "R0 B0 R1 B1" in " ".join(out.splitlines()[2].split())
    text = "\n".join(line for line in out.splitlines() if line.startswith("rank "))
    assert text.startswith("rank 0 (stage 0): 0F0 0SA0>1 0F1 0SA1>1 0RG0<1 0R0 0B0")
    path = tmp_path / "s.txt"
    path.write_text(text)
    code, out, _ = run_main(capsys, "schedule", "--from-file", str(path))
    assert code == 0 and "valid" in out.splitlines()[0]


def test_schedule_reports_a_deadlock_with_its_grid(capsys, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text(
        "rank 0 (stage 0): 0RG0<1 0F0 0SA0>1 0B0\nrank 1 (stage 1): 1RA0<0 1F0 1B0 1SG0>0\n"
    )
    code, out, err = run_main(capsys, "schedule", "--from-file", str(path))
    assert code == 2 and out == ""
    assert (
        "Error: invalid schedule: deadlock at step 0: rank 0 (its action 0, 0RG0<1) "
        "waits for the gradient of micro-batch 0 from rank 1" in err
    )
    assert "rank0  !" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "3,1", "--microbatches", "4"], "must be a multiple of that"),
        (["--replicas", "2,x"], "--replicas: '2,x' is not allowed"),
        (["--scheme", "gpipe", "--set", "stash=false"], "--set stash: unknown setting"),
    ],
)
def test_schedule_errors_are_one_line(capsys, args, message):
    code, out, err = run_main(capsys, "schedule", *args)
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("scheme", ["mp", "gpipe", "pipedream", "spectrain"])
def test_run_with_pipeline_schemes(capsys, scheme):
    code, out, err = run_main(
        capsys,
        "run",
        "--gpus",
        "4",
        "--scheme",
        scheme,
        "--model",
        "resnet18",
        "--iterations",
        "2",
        "--json",
    )
    assert code == 0, err
    d = json.loads(out)
    assert set(CONTRACT_KEYS) <= set(d)
    assert d["scheme"] == scheme and d["global_batch_size"] == d["batch_size"]
    assert d["stages"] == len(d["stage_replicas"])


def test_run_table_shows_the_pipeline(capsys):
    code, out, _ = run_main(
        capsys,
        "run",
        "--gpus",
        "4",
        "--scheme",
        "gpipe",
        "--model",
        "vgg16",
        "--set",
        "scheme.microbatches=8",
        "--set",
        "scheme.partition=compute",
    )
    assert code == 0
    assert re.search(r"partition\s+compute\n", out) and re.search(r"microbatches\s+8\n", out)


def test_run_refuses_more_micro_batches_than_samples(capsys):
    code, _, err = run_main(
        capsys,
        "run",
        "--gpus",
        "2",
        "--scheme",
        "gpipe",
        "--batch-size",
        "4",
        "--set",
        "scheme.microbatches=8",
    )
    assert code == 2
    assert "scheme.microbatches: 8 is not allowed; at most the batch size (4)" in err
