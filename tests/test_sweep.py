"""``sim sweep``: planning, rows equal to ``sim run --json``, resuming, failures, workers."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.store import SweepStore, read_table, rows_frame
from analysis.sweep import (
    plan_sweep,
    point_id,
    run_in_process,
    run_sweep,
    unflatten_row,
)
from dtsim.spec import RunSpec
from simcore.config import ConfigError
from simcore.result import CONTRACT_KEYS
from tests.test_cli import run_main

# Small, fast points: ResNet-18 on 2 or 4 GPUs, one measured iteration.
SMALL = ["--model", "resnet18", "--set", "iterations=1", "-j", "1", "--no-progress"]

NO_HOST_PRESET = """\
name: nohost
summary: GPUs on one PCIe switch and no host CPU (parameter servers cannot be colocated)
gpu: {model: V100, memory: 16GiB, memory_bandwidth: 900GB/s, peak_flops: 15.7e12}
box:
  gpus: 4
  devices: {sw0: pcie_switch}
  links:
    - [gpu0, sw0, pcie, 12GB/s, 1us]
    - [gpu1, sw0, pcie, 12GB/s, 1us]
    - [gpu2, sw0, pcie, 12GB/s, 1us]
    - [gpu3, sw0, pcie, 12GB/s, 1us]
"""


def ok_rows(path) -> list[dict]:
    df = read_table(str(path))
    return df[df["status"] == "ok"].to_dict(orient="records")


# ---- planning -------------------------------------------------------------------------


def test_plan_is_the_cross_product_in_axis_order():
    plan = plan_sweep(RunSpec(), {"scheme": "dp,ps", "gpus": "2,4,8", "bandwidth": "1Gbps"})
    got = [(p.values["scheme"], p.values["gpus"], p.values["bandwidth"]) for p in plan.points]
    assert got == [(s, g, "1Gbps") for s in ("dp", "ps") for g in (2, 4, 8)]
    assert all(p.spec.gpus == p.values["gpus"] for p in plan.points)
    assert len({p.point_id for p in plan.points}) == 6


def test_point_id_is_stable_and_covers_the_whole_spec():
    a = RunSpec().replace(gpus=4)
    assert point_id(a) == point_id(RunSpec().replace(gpus="4"))
    assert point_id(a) != point_id(a.replace(seed=1))
    assert point_id(a) != point_id(a.replace(**{"scheme.bucket_bytes": "1MiB"}))


def test_scheme_option_applies_only_to_schemes_that_take_it():
    plan = plan_sweep(RunSpec(), {"scheme": "dp,ps", "scheme.algorithm": "ring,tree"})
    got = [(p.values["scheme"], p.values["scheme.algorithm"]) for p in plan.points]
    assert got == [("dp", "ring"), ("dp", "tree"), ("ps", None)]
    assert dict(plan.points[1].spec.scheme_options) == {"algorithm": "tree"}
    assert dict(plan.points[2].spec.scheme_options) == {}


@settings(max_examples=30, deadline=None)
@given(
    gpus=st.lists(st.integers(1, 64), min_size=1, max_size=4, unique=True),
    seeds=st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True),
    schemes=st.sampled_from([("dp",), ("ps",), ("dp", "ps"), ("ps", "dp")]),
)
def test_plan_has_one_point_per_combination(gpus, seeds, schemes):
    plan = plan_sweep(RunSpec(), {"scheme": list(schemes), "gpus": gpus, "seed": seeds})
    assert len(plan.points) == len(gpus) * len(seeds) * len(schemes)
    combos = {(p.spec.scheme, p.spec.gpus, p.spec.seed) for p in plan.points}
    assert combos == {(s, g, d) for s in schemes for g in gpus for d in seeds}
    assert len({p.point_id for p in plan.points}) == len(plan.points)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpus", "2,x"], "--gpus: 'x' is not allowed; expected an integer"),
        (["--gpus", "2,,4"], "--gpus: '2,,4' is not allowed; expected a comma-separated list"),
        (["--gpus", "2,02"], "--gpus: 2 is not allowed; is listed twice"),
        (["--gpus", "0,2"], "--gpus: '0' is not allowed; must be at least 1"),
        (["--scheme", "dp,foo"], "--scheme: 'foo' is not allowed; choose one of: dp, ps"),
        (["--bandwidth", "1Gbps,fast"], "--bandwidth: 'fast' is not allowed; expected a rate"),
        (["--model", "resnet50,resnet5"], "--model: 'resnet5' is not allowed"),
        (["--topology", "pcie,mars"], "--topology: 'mars' is not allowed; choose one of"),
        (["--fidelity", "exact"], "--fidelity: 'exact' is not allowed; choose one of: detailed"),
        (["--set", "nope=1,2"], "nope: unknown setting; known: scheme, gpus"),
        (
            ["--set", "scheme.nope=1,2"],
            "scheme.nope: unknown setting; none of the swept schemes (dp) takes this option",
        ),
        (
            ["--scheme", "dp,ps", "--set", "scheme.algorithm=ring,star"],
            "scheme.algorithm: 'star' is not allowed; choose one of",
        ),
        (["--set", "chunk_bytes=1MiB,huge"], "chunk_bytes: 'huge' is not allowed; expected a size"),
        (["--set", "gpus"], "--set: 'gpus' is not allowed; expected KEY=VALUE"),
        (
            ["--out", "results.txt"],
            "--out: 'results.txt' is not allowed; expected a file name ending in .parquet or .csv",
        ),
        (
            ["--scheduler", "localhost:8786"],
            "--scheduler: 'localhost:8786' is not allowed; "
            "expected an address like tcp://HOST:PORT",
        ),
        (["--jobs", "0"], "--jobs: 0 is not allowed; expected a positive number"),
    ],
)
def test_bad_sweep_specs_are_one_line_exit_2(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "sweep", "--gpus", "2", *SMALL, *args)
    assert code == 2, err
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""
    assert os.listdir(tmp_path) == []  # nothing half-written


def test_out_that_is_not_a_sweep_output_is_refused(tmp_path, capsys):
    other = tmp_path / "mine.csv"
    other.write_text("a,b\n1,2\n")
    code, _out, err = run_main(capsys, "sweep", "--gpus", "2", *SMALL, "--out", str(other))
    assert code == 2
    assert "is not a sweep's output (no point_id column)" in err
    assert other.read_text() == "a,b\n1,2\n"


def test_config_file_lists_are_swept_and_scalars_shared(tmp_path, capsys):
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        "model: resnet18\niterations: 1\ngpus: [2, 4]\nscheme: [dp, ps]\n"
        "scheme.algorithm: [ring, tree]\n"
    )
    code, out, err = run_main(capsys, "sweep", "--config", str(cfg), "--gpus", "2", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == "3 points:"  # --gpus overrides the file's list
    lines = out.splitlines()[1:]
    assert [ln.split(None, 1)[1] for ln in lines] == [
        "gpus=2 scheme=dp scheme.algorithm=ring",
        "gpus=2 scheme=dp scheme.algorithm=tree",
        "gpus=2 scheme=ps scheme.algorithm=-",
    ]


def test_dry_run_lists_points_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _err = run_main(capsys, "sweep", "--scheme", "dp,ps", "--gpus", "2,4", "--dry-run")
    assert code == 0
    assert out.splitlines()[0] == "4 points:"
    assert "scheme=ps gpus=4" in out
    assert os.listdir(tmp_path) == []


# ---- rows ----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_rows_equal_individual_sim_run_json(tmp_path, capsys, suffix):
    out = tmp_path / f"r.{suffix}"
    code, text, err = run_main(
        capsys,
        "sweep",
        "--scheme",
        "dp,ps",
        "--gpus",
        "2,4",
        "--topology",
        "ethernet",
        "--bandwidth",
        "5Gbps",
        *SMALL,
        "--out",
        str(out),
    )
    assert code == 0, err
    assert text.startswith(f"4 points into {out}: 4 computed, 0 already there; 4 rows")
    rows = ok_rows(out)
    assert len(rows) == 4
    for row in rows:
        assert row["bandwidth"] == "5Gbps" and row["bandwidth_bytes_per_s"] == 5e9 / 8
        code, js, err = run_main(
            capsys,
            "run",
            "--scheme",
            row["scheme"],
            "--gpus",
            str(row["gpus"]),
            "--topology",
            "ethernet",
            "--bandwidth",
            "5Gbps",
            "--model",
            "resnet18",
            "--iterations",
            "1",
            "--json",
        )
        assert code == 0, err
        expected = json.loads(js)
        assert set(CONTRACT_KEYS) <= set(expected)
        got = unflatten_row(row, expected)
        for key in expected:
            if key != "wall_s":
                assert got[key] == expected[key], key
        assert row["wall_s"] > 0


def test_a_failing_point_is_recorded_and_the_rest_complete(tmp_path, capsys):
    preset = tmp_path / "nohost.yaml"
    preset.write_text(NO_HOST_PRESET)
    out = tmp_path / "r.csv"
    args = [
        "sweep",
        "--scheme",
        "ps,dp",
        "--gpus",
        "2,4",
        "--topology",
        str(preset),
        *SMALL,
        "--out",
        str(out),
    ]
    code, text, err = run_main(capsys, *args)
    # The sweep goes on past failed points but exits 1, saying how many failed.
    assert code == 1, err
    assert "2 of 4 points failed" in err
    assert "4 computed (2 failed)" in text
    assert f"failed: scheme=ps gpus=2 model=resnet18 topology={preset} " in text
    assert "has no host CPUs" in text
    df = read_table(str(out))
    failed = df[df["status"] == "error"]
    assert sorted(failed["gpus"]) == [2, 4] and set(failed["scheme"]) == {"ps"}
    assert failed["error"].str.contains("ConfigError: scheme.placement").all()
    assert failed["throughput_samples_s"].isna().all()
    done = df[df["status"] == "ok"]
    assert sorted(done["gpus"]) == [2, 4] and (done["throughput_samples_s"] > 0).all()
    # a rerun does not repeat the failures; --retry-failed does
    code, text, err = run_main(capsys, *args)
    assert "0 computed, 4 already there" in text
    assert code == 1 and "2 from an earlier run" in err
    code, text, _ = run_main(capsys, *args, "--retry-failed")
    assert "2 computed (2 failed), 2 already there" in text and code == 1


# ---- resuming --------------------------------------------------------------------------


class Interrupt(KeyboardInterrupt):
    pass


def test_interrupted_sweep_resumes_without_recomputing_or_losing_rows(tmp_path):
    plan = plan_sweep(RunSpec().replace(model="resnet18", iterations=1), {"gpus": "1,2,3,4,5"})
    out = str(tmp_path / "r.parquet")
    seen = []

    def stop_after_two(row):
        seen.append(row)
        if len(seen) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_sweep(plan, out, on_row=stop_after_two)
    first = {r["point_id"]: r["wall_s"] for r in ok_rows(out)}
    assert len(first) == 2 and not os.path.exists(out + ".journal.jsonl")

    ran = []
    summary = run_sweep(plan, out, on_row=ran.append)
    assert (summary.skipped, summary.computed, summary.rows) == (2, 3, 5)
    assert not {r["point_id"] for r in ran} & set(first)
    rows = ok_rows(out)
    assert sorted(r["gpus"] for r in rows) == [1, 2, 3, 4, 5]
    assert {r["point_id"]: r["wall_s"] for r in rows if r["point_id"] in first} == first
    # a third run has nothing to do
    assert run_sweep(plan, out).computed == 0


def test_killed_sweep_resumes_from_its_journal(tmp_path, capsys):
    out = tmp_path / "r.parquet"
    journal = tmp_path / "r.parquet.journal.jsonl"
    args = [
        "sweep",
        "--gpus",
        "4,8",
        "--topology",
        "ethernet",
        "--bandwidth",
        "1Gbps,5Gbps,10Gbps",
        "--set",
        "iterations=3",
        "-j",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from dtsim.cli import main; main()", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_text().count("\n") >= 2:
                break
            time.sleep(0.01)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
        proc.stderr.close()
    assert not out.exists()  # killed before it could write the table
    lines = journal.read_text().splitlines()
    before = {json.loads(line)["point_id"]: json.loads(line)["wall_s"] for line in lines}
    assert 2 <= len(before) < 6
    with journal.open("a") as fh:
        fh.write('{"point_id": "0123456789abcdef", "status": "ok", "thr')  # torn write

    code, text, err = run_main(capsys, *args)
    assert code == 0, err
    assert f"{6 - len(before)} computed, {len(before)} already there; 6 rows" in text
    rows = ok_rows(out)
    assert len(rows) == 6 and len({r["point_id"] for r in rows}) == 6
    assert {r["point_id"]: r["wall_s"] for r in rows if r["point_id"] in before} == before
    assert not journal.exists()


def test_journal_rows_survive_and_torn_line_is_cut(tmp_path):
    out = str(tmp_path / "r.csv")
    with SweepStore(out) as store:
        store.append({"point_id": "a", "status": "ok", "x": 1.5})
        store.append({"point_id": "b", "status": "error", "error": "boom"})
    # closed without save(): the rows are only in the journal
    with open(out + ".journal.jsonl", "a") as fh:
        fh.write('{"point_id": "c"')
    with SweepStore(out) as store:
        assert set(store.rows) == {"a", "b"}
        assert store.rows["b"]["error"] == "boom"
        store.save()
    assert read_table(out)["point_id"].tolist() == ["a", "b"]


def test_long_sweeps_rewrite_the_table_as_they_go(tmp_path, monkeypatch):
    monkeypatch.setattr(SweepStore, "SAVE_EVERY_S", 0.0)
    out = str(tmp_path / "r.parquet")
    with SweepStore(out) as store:
        for i in range(3):
            store.append({"point_id": f"p{i}", "status": "ok", "x": i})
            assert read_table(out)["x"].tolist() == list(range(i + 1))
            assert os.path.getsize(out + ".journal.jsonl") == 0
    assert not os.path.exists(out + ".journal.jsonl")


def test_second_writer_is_refused_while_a_sweep_runs(tmp_path):
    out = str(tmp_path / "r.parquet")
    with SweepStore(out), pytest.raises(ConfigError, match="another sweep is writing it"):
        SweepStore(out).__enter__()
    with SweepStore(out):  # free again afterwards
        pass
    assert not os.path.exists(out + ".lock")


def test_mixed_type_columns_are_written_as_text(tmp_path):
    df = rows_frame(
        [{"point_id": "a", "scheme.k": 4}, {"point_id": "b", "scheme.k": "4MiB"}, {"point_id": "c"}]
    )
    assert df["scheme.k"].tolist()[:2] == ["4", "4MiB"]
    assert df["scheme.k"].isna().tolist()[2]
    df.to_parquet(tmp_path / "x.parquet")


# ---- workers ---------------------------------------------------------------------------


def _metrics(rows):
    return {r["point_id"]: {k: v for k, v in r.items() if k != "wall_s"} for r in rows}


def test_joblib_and_dask_give_the_same_rows_as_in_process(tmp_path, capsys):
    from dask.distributed import LocalCluster

    plan = plan_sweep(
        RunSpec().replace(model="resnet18", iterations=1), {"scheme": "dp,ps", "gpus": "2,4"}
    )
    expected = _metrics(run_in_process(plan.points))

    jl = tmp_path / "joblib.parquet"
    summary = run_sweep(plan, str(jl), jobs=2)
    assert summary.computed == 4
    got = _metrics(read_table(str(jl)).to_dict(orient="records"))
    assert got.keys() == expected.keys()
    for pid, row in expected.items():
        assert {k: got[pid][k] for k in row} == row

    cluster = LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    )
    try:
        out = tmp_path / "dask.csv"
        code, text, err = run_main(
            capsys,
            "sweep",
            "--scheme",
            "dp,ps",
            "--gpus",
            "2,4",
            *SMALL,
            "--scheduler",
            cluster.scheduler_address,
            "--out",
            str(out),
        )
        assert code == 0, err
        assert "4 computed, 0 already there" in text
        rows = read_table(str(out)).to_dict(orient="records")
        assert len(rows) == 4
        for r in rows:
            want = expected[r["point_id"]]
            for k in (
                "throughput_samples_s",
                "iteration_time_s",
                "events",
                "speedup",
                "comm_bytes_total",
                "per_gpu_utilization",
            ):
                assert r[k] == want[k] or (
                    isinstance(want[k], float) and math.isclose(r[k], want[k], rel_tol=1e-12)
                )
    finally:
        cluster.close()


def test_unreachable_scheduler_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("analysis.sweep.CONNECT_TIMEOUT_S", 0.5)
    code, _out, err = run_main(
        capsys,
        "sweep",
        "--gpus",
        "2",
        *SMALL,
        "--scheduler",
        "tcp://127.0.0.1:9",
        "--out",
        str(tmp_path / "r.csv"),
    )
    assert code == 2
    assert "--scheduler: 'tcp://127.0.0.1:9' is not allowed; no Dask scheduler answers" in err
