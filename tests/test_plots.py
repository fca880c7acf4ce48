"""``sim plot``: figures are written, non-empty, and draw what the data says."""

from __future__ import annotations

import json

import matplotlib
import pytest

matplotlib.use("Agg")

from analysis.plots import gantt_plot, read_chrome_trace, speedup_plot, throughput_plot, xy_plot
from analysis.store import read_table
from analysis.sweep import plan_sweep, run_sweep
from dtsim.cli import main
from dtsim.spec import RunSpec
from tests.test_cli import run_main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> str:
    """dp and ps on 2 and 4 one-GPU hosts at 1 and 10 Gbps (ResNet-18, one iteration)."""
    path = str(tmp_path_factory.mktemp("plots") / "r.parquet")
    plan = plan_sweep(
        RunSpec().replace(model="resnet18", topology="ethernet", iterations=1),
        {"scheme": "dp,ps", "gpus": "2,4", "bandwidth": "1Gbps,10Gbps"},
    )
    run_sweep(plan, path)
    return path


@pytest.fixture(scope="module")
def chrome_trace(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("trace") / "t.json")
    with pytest.raises(SystemExit) as ex:
        main(
            [
                "run",
                "--gpus",
                "2",
                "--scheme",
                "dp",
                "--model",
                "resnet18",
                "--iterations",
                "2",
                "--trace-out",
                path,
            ]
        )
    assert ex.value.code == 0
    return path


def lines_with_data(ax) -> list:
    return [ln for ln in ax.lines if len(ln.get_xdata()) > 1]


def test_generic_line_plot_draws_one_line_per_hue_in_each_panel(results):
    df = read_table(results)
    fig = xy_plot(df, "bandwidth", "throughput_samples_s", hue="scheme", col="gpus")
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == ["gpus = 2", "gpus = 4"]
    for ax in panels:
        gpus = int(ax.get_title().split("= ")[1])
        lines = lines_with_data(ax)
        assert len(lines) == 2
        for ln in lines:
            assert list(ln.get_xdata()) == [1.0, 10.0]  # Gbit/s
        # the y values are the rows' throughputs, in bandwidth order
        want = sorted(
            df[df["gpus"] == gpus].groupby("scheme")["throughput_samples_s"].apply(list).tolist()
        )
        got = sorted(sorted(ln.get_ydata().tolist()) for ln in lines)
        assert got == [sorted(w) for w in want]


def test_speedup_plot_adds_the_linear_ideal(results):
    fig = speedup_plot(read_table(results), where={"bandwidth": "10Gbps"})
    ax = fig.axes[0]
    ideal = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(ideal) == 1 and list(ideal[0].get_xdata()) == [2, 4]
    assert len(lines_with_data(ax)) == 3  # dp, ps, linear


def test_throughput_plot_uses_a_log_bandwidth_axis(results):
    fig = throughput_plot(read_table(results), col="gpus")
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert len(axes) == 2 and all(ax.get_xscale() == "log" for ax in axes)
    assert axes[0].get_xlabel() == "inter-node bandwidth (Gbit/s)"


@pytest.mark.parametrize(
    "args, suffix",
    [
        (
            ["--x", "bandwidth", "--y", "throughput_samples_s", "--hue", "scheme", "--col", "gpus"],
            "png",
        ),
        (["--kind", "throughput", "--col", "gpus"], "svg"),
        (["--kind", "speedup", "--where", "bandwidth=1Gbps"], "png"),
        (["--kind", "utilization", "--where", "gpus=4", "--where", "bandwidth=1Gbps"], "pdf"),
        (["--x", "scheme", "--y", "comm_bytes_per_iteration", "--col", "gpus"], "png"),
    ],
)
def test_sim_plot_writes_non_empty_figures(results, tmp_path, capsys, args, suffix):
    out = tmp_path / f"fig.{suffix}"
    code, text, err = run_main(capsys, "plot", results, *args, "--out", str(out))
    assert code == 0, err
    assert text == f"wrote {out}\n"
    data = out.read_bytes()
    assert len(data) > 5000
    if suffix == "png":
        assert data.startswith(PNG)
    elif suffix == "svg":
        assert b"<svg" in data[:1000]
    else:
        assert data.startswith(b"%PDF")


def test_utilization_has_one_bar_per_gpu_and_configuration(results):
    from analysis.plots import utilization_plot

    df = read_table(results)
    fig = utilization_plot(df, where={"gpus": "4", "bandwidth": "1Gbps"})
    bars = [p for p in fig.axes[0].patches if p.get_height() > 0]
    assert len(bars) == 8  # 4 GPUs x (dp, ps)
    want = sorted(
        100 * u
        for r in df[(df["gpus"] == 4) & (df["bandwidth"] == "1Gbps")]["per_gpu_utilization"]
        for u in json.loads(r)
    )
    assert sorted(b.get_height() for b in bars) == pytest.approx(want)


def test_default_output_name_and_run_json_input(tmp_path, capsys):
    js = tmp_path / "one.json"
    code, out, _ = run_main(
        capsys, "run", "--gpus", "4", "--model", "resnet18", "--json", "--iterations", "1"
    )
    js.write_text(out)
    code, text, err = run_main(capsys, "plot", str(js), "--kind", "utilization")
    assert code == 0, err
    fig = tmp_path / "one-utilization.png"
    assert text == f"wrote {fig}\n" and fig.read_bytes().startswith(PNG)


def test_gantt_draws_every_slice_of_the_trace(chrome_trace, tmp_path, capsys):
    trace = read_chrome_trace(chrome_trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    fig = gantt_plot(trace)
    ax = fig.axes[0]
    drawn = sum(len(c.get_paths()) for c in ax.collections)
    assert drawn == len(slices)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "gpu0 compute" and "gpu1 compute" in labels
    one = gantt_plot(trace, where={"iteration": "1", "device": "gpu0"})
    want = [e for e in slices if e["args"].get("iteration") == 1 and e["pid"] == 0]
    assert sum(len(c.get_paths()) for c in one.axes[0].collections) == len(want)

    out = tmp_path / "gantt.png"
    code, _text, err = run_main(capsys, "plot", chrome_trace, "--kind", "gantt", "--out", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 10000


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--x", "bandwidth", "--y", "nope"],
            "--y: 'nope' is not allowed; not a column of the results; columns: point_id, status",
        ),
        (
            ["--kind", "speedup", "--where", "gpus=3"],
            "--where: 'gpus=3' is not allowed; selects no successful rows",
        ),
        (
            ["--kind", "speedup", "--where", "color=red"],
            "--where: 'color=red' is not allowed; no column 'color'",
        ),
        (["--y", "speedup"], "--x: '' is not allowed; give --x and --y, or a ready --kind"),
        (
            ["--x", "scheme", "--y", "speedup", "--kind", "line"],
            "--x: 'scheme' is not allowed; a line plot needs a numeric x",
        ),
        (["--kind", "gantt"], "is not a JSON Chrome trace"),
        (
            ["--kind", "speedup", "--out", "fig.jpg"],
            "--out: 'fig.jpg' is not allowed; expected a file name ending in .png, .svg, .pdf",
        ),
    ],
)
def test_bad_plot_requests_are_one_line_exit_2(
    results, tmp_path, capsys, monkeypatch, args, needle
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "plot", results, *args)
    assert code == 2, err
    assert needle in err and err.count("\n") == 1
    assert out == "" and list(tmp_path.iterdir()) == []


def test_a_trace_is_not_a_results_table(chrome_trace, capsys):
    code, _out, err = run_main(capsys, "plot", chrome_trace, "--kind", "speedup")
    assert code == 2 and "is a Chrome trace: plot it with --kind gantt" in err


def test_missing_results_file(capsys, tmp_path):
    code, _out, err = run_main(capsys, "plot", str(tmp_path / "none.csv"), "--kind", "speedup")
    assert code == 2 and "none.csv' is not allowed; does not exist" in err
