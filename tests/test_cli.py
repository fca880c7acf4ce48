"""The ``sim`` command, as a user drives it."""

from __future__ import annotations

import json
from itertools import pairwise

import pytest
from click.testing import CliRunner

from dtsim.cli import cli, main
from simcore.result import CONTRACT_KEYS


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=True)
    return r.exit_code, r.stdout, r.stderr


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """Through ``main`` (the console script), which maps errors to one line + exit code."""
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return ex.value.code, out, err


def test_help_lists_commands(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    for cmd in ("run", "schemes", "models", "topologies"):
        assert cmd in out


def test_run_prints_a_table(capsys):
    code, out, err = run_main(capsys, "run", "--gpus", "8", "--scheme", "dp")
    assert code == 0, err
    assert "iteration time" in out and "speedup" in out and "8 GPUs" in out


def test_run_json_has_every_contract_key(capsys):
    code, out, _ = run_main(capsys, "run", "--gpus", "8", "--scheme", "dp", "--json")
    assert code == 0
    d = json.loads(out)
    assert set(CONTRACT_KEYS) <= set(d)
    assert d["scheme"] == "dp" and d["gpus"] == 8 and d["model"] == "resnet50"
    assert 5 < d["speedup"] <= 8 and 0 < d["gpu_utilization"] <= 1
    assert len(d["per_gpu_utilization"]) == 8
    assert d["comm_bytes_total"] > 0 and d["events"] > 0 and d["wall_s"] > 0


def test_trace_out_is_a_valid_chrome_trace_with_flows(tmp_path, capsys):
    path = tmp_path / "t.json"
    code, _out, err = run_main(
        capsys,
        "run",
        "--gpus",
        "2",
        "--scheme",
        "dp",
        "--model",
        "resnet18",
        "--iterations",
        "1",
        "--trace-out",
        str(path),
    )
    assert code == 0, err
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"gpu0", "gpu1"} <= names
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"compute", "send", "recv"} <= threads
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert starts and starts == ends
    # slices on one thread nest (no partial overlap), as the format requires
    by_thread: dict[tuple, list] = {}
    for e in events:
        if e["ph"] == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_s1, e1), (s2, _e2) in pairwise(spans):
            assert s2 >= e1 - 1e-6


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--scheme", "foo"], "'foo' is not one of"),
        (["--gpus", "0"], "--gpus: 0 is not allowed; must be at least 1"),
        (["--bandwidth", "fast"], "--bandwidth: 'fast' is not allowed; expected a rate"),
        (["--model", "resnet5"], "--model: 'resnet5' is not allowed"),
        (["--topology", "mars"], "--topology: 'mars' is not allowed; choose one of: dgx-a100"),
        (["--set", "scheme.algorithm=star"], "scheme.algorithm: 'star' is not allowed"),
        (["--set", "nope=1"], "nope: unknown setting"),
        (["--set", "novalue"], "expected KEY=VALUE"),
        (["--config", "/nonexistent.yaml"], "does not exist"),
        (["--set", "compute_scale=inf"], "compute_scale: 'inf' is not allowed; expected a finite"),
        (["--seed", "-1"], "--seed: -1 is not allowed; must be at least 0"),
        (["--set", "chunk_bytes=100"], "chunk_bytes: 100 is not allowed; must be at least 4096"),
        (["--trace-out", "/nonexistent-dtsim/x.json"], "folder /nonexistent-dtsim does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_traceback(capsys, args, needle):
    code, out, err = run_main(capsys, "run", *args)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_malformed_trace_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"format": "dtsim-trace", "version": 1, "meta": {"model": "x", '
        '"device": "cpu", "batch_size": 4}, "layers": [{"name": "a", '
        '"forward_s": "slow", "backward_s": 1}]}'
    )
    code, _out, err = run_main(capsys, "run", "--model", str(bad))
    assert code == 2
    assert str(bad) in err and "layers[0].forward_s" in err and "non-negative number" in err


def test_trace_out_not_written_on_error(tmp_path, capsys):
    path = tmp_path / "t.json"
    code, _out, _err = run_main(capsys, "run", "--bandwidth", "fast", "--trace-out", str(path))
    assert code == 2 and not path.exists()


def test_config_file_then_flags_then_set(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "scheme: ps\ngpus: 3\nmodel: resnet18\niterations: 1\n"
        "scheme_options: {placement: dedicated}\n"
    )
    code, out, err = run_main(
        capsys, "run", "--config", str(cfg), "--gpus", "2", "--set", "iterations=2", "--json"
    )
    assert code == 0, err
    d = json.loads(out)
    assert (d["scheme"], d["gpus"], d["model"], d["iterations"]) == ("ps", 2, "resnet18", 2)


def test_set_scheme_option_changes_the_result(capsys):
    base = [
        "run",
        "--gpus",
        "16",
        "--topology",
        "dgx1",
        "--model",
        "resnet18",
        "--json",
        "--iterations",
        "1",
    ]
    _c, ring, _e = run_main(capsys, *base)
    _c, hier, _e = run_main(capsys, *base, "--set", "scheme.algorithm=hierarchical")
    assert json.loads(ring)["iteration_time_s"] != json.loads(hier)["iteration_time_s"]


def test_listings(capsys):
    code, out, _ = run_main(capsys, "schemes")
    assert code == 0 and out.splitlines()[0].startswith("dp ")
    code, out, _ = run_main(capsys, "schemes", "-v")
    assert "bucket_bytes" in out and "placement" in out
    code, out, _ = run_main(capsys, "models")
    assert "resnet50" in out and "(default)" in out and "25.6M params" in out
    code, out, _ = run_main(capsys, "topologies")
    assert all(n in out for n in ("pcie", "dgx1", "dgx-a100", "ethernet", "ib-cluster"))


def test_cli_runner_smoke():
    code, out, _ = run("run", "--gpus", "2", "--model", "resnet18", "--iterations", "1")
    assert code == 0 and "resnet18" in out
