"""Emulated devices: a model built from a layer trace whose compute takes the trace's
times without CPU (realrun.emudevice, traces.emulated), run for real by every scheme
family, with the bytes and the prediction the simulator gives (analysis.emulated)."""

from __future__ import annotations

import json
import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.emulated import (
    ELEMENT_BYTES,
    EmulatedSpec,
    emulated_trace,
    format_ref,
    load_run_trace,
    parse_ref,
)
from traces.model import Layer, Trace, TraceMeta

torch = pytest.importorskip("torch", reason="the emulated device runs torch modules")


def chain_trace(forward_s: float = 0.02, backward_s: float = 0.04, n: int = 5) -> Trace:
    """An input and ``n`` layers in a chain, each with parameters."""
    layers = [Layer("data", 0.001, 0.0, 0, 64 * 100 * 4, kind="input")]
    layers += [
        Layer(f"block.{i}", forward_s, backward_s, 4000 * (i + 1), 64 * 50 * 4) for i in range(n)
    ]
    edges = tuple((i, i + 1) for i in range(n))
    return Trace(TraceMeta("chain", "V100", 64), tuple(layers), edges)


# ---- the trace an emulated device runs ---------------------------------------------------


def test_a_reference_round_trips_and_names_what_is_wrong() -> None:
    spec = EmulatedSpec("resnet50", 32, 10, 4)
    assert parse_ref(format_ref(spec)) == spec
    for bad, word in (
        ("emulated:resnet50;batch=0", "batch_size"),
        ("emulated:resnet50;dilation=0.5;batch=4", "dilation"),
        ("emulated:resnet50;batch=4;speed=2", "speed=2"),
        ("emulated:resnet50", "batch"),
    ):
        with pytest.raises(ValueError, match=word):
            parse_ref(bad)


@settings(max_examples=40, deadline=None)
@given(
    k=st.floats(1, 50),
    b=st.floats(1, 64),
    batch=st.integers(1, 256),
)
def test_the_run_trace_dilates_times_and_scales_bytes_in_whole_elements(
    k: float, b: float, batch: int
) -> None:
    base = load_run_trace("emulated:resnet18;batch=256;dilation=1;bytes=1")
    run = emulated_trace(EmulatedSpec("resnet18", batch, k, b), base)
    scaled = base.rescale_batch(batch)
    assert [lay.kind for lay in run.layers] == [lay.kind for lay in scaled.layers]
    for a, r in zip(scaled.layers, run.layers, strict=True):
        assert r.forward_s == pytest.approx(a.forward_s * k)
        assert r.backward_s == pytest.approx(a.backward_s * k)
        assert r.param_bytes % ELEMENT_BYTES == 0
        assert r.activation_bytes % (ELEMENT_BYTES * batch) == 0
        if a.param_bytes:
            assert abs(r.param_bytes - a.param_bytes / b) <= max(
                ELEMENT_BYTES, 0.5 * a.param_bytes / b
            )
        else:
            assert r.param_bytes == 0


def test_inputs_come_first_and_names_are_identifiers() -> None:
    run = load_run_trace("emulated:gnmt;batch=64;dilation=1;bytes=1")
    kinds = [lay.kind for lay in run.layers]
    first_layer = kinds.index("layer")
    assert all(k == "input" for k in kinds[:first_layer]) and "input" not in kinds[first_layer:]
    assert all(lay.name.isidentifier() for lay in run.layers)
    assert all(a < b for a, b in run.edges)


# ---- the device ----------------------------------------------------------------------------


def _chain_model(tmp_path, **kw):
    from realrun import emudevice
    from traces.jsonfmt import save

    path = tmp_path / "chain.json"
    save(chain_trace(**kw), str(path))
    ref = format_ref(EmulatedSpec(str(path), 64, 1, 1))
    return emudevice, emudevice.build(ref)


def test_an_emulated_layer_takes_its_time_and_almost_no_cpu(tmp_path) -> None:
    emudevice, model = _chain_model(tmp_path)
    x = torch.zeros(64, 100)
    model(x).pow(2).mean().backward()  # warm
    emudevice.sync()
    wall0, cpu0 = time.monotonic(), time.process_time()
    for _ in range(3):
        model(x).pow(2).mean().backward()
        emudevice.sync()
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    expected = 3 * 5 * (0.02 + 0.04)
    assert wall == pytest.approx(expected, rel=0.1)
    assert cpu < 0.25 * wall, f"the device used {cpu:.3f} s of CPU in {wall:.3f} s"
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


def test_overshoots_do_not_add_up_from_op_to_op() -> None:
    from realrun.emudevice import DeviceClock

    clock = DeviceClock()
    t0 = time.monotonic()
    clock.free_at = t0
    for _ in range(100):  # sync after every op: each sleep overshoots a little
        clock.issue(0.002)
        clock.sync()
    # the device's own clock has no overshoot in it: 100 ops of 2 ms end 0.2 s after t0
    assert clock.free_at - t0 == pytest.approx(0.2, abs=0.02)


def test_the_zero_bubble_split_charges_each_part_once(tmp_path) -> None:
    emudevice, model = _chain_model(tmp_path)
    x = torch.zeros(64, 100, requires_grad=True)
    busy = emudevice.CLOCK.busy_s
    out = model(x).pow(2).mean()
    with emudevice.backward_part("input"):
        torch.autograd.grad(out, [x], retain_graph=True)
    with emudevice.backward_part("weight"):
        torch.autograd.grad(out, list(model.parameters()))
    emudevice.sync()
    assert emudevice.CLOCK.busy_s - busy == pytest.approx(5 * (0.02 + 0.04))


def test_a_pipelines_micro_batches_reuse_kept_weight_gradients(tmp_path) -> None:
    from realrun.pipeline import accumulate

    emudevice, model = _chain_model(tmp_path)
    x = torch.zeros(64, 100)
    params = list(model.parameters())

    def grads() -> list[torch.Tensor]:
        return list(torch.autograd.grad(model(x).pow(2).mean(), params))

    first, second = grads(), grads()  # both alive: a new tensor per backward
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, second, strict=True))
    with emudevice.kept_weight_grads():
        kept = grads()
        again = grads()
    assert [g.data_ptr() for g in kept] == [g.data_ptr() for g in again]
    assert all(g.shape == p.shape for g, p in zip(kept, params, strict=True))
    sums: list[torch.Tensor | None] = [None] * len(params)
    accumulate(sums, kept, add=False)
    before = [s.clone() for s in sums if s is not None]
    accumulate(sums, [torch.ones_like(p) for p in params], add=False)  # not summed
    assert all(torch.equal(a, b) for a, b in zip(before, sums, strict=True))
    summed: list[torch.Tensor | None] = [None] * len(params)
    for _ in range(2):  # real compute: summed
        accumulate(summed, [torch.ones_like(p) for p in params])
    assert all(s is not None and float(s.sum()) == 2 * s.numel() for s in summed)
    emudevice.sync()


def test_the_layer_graph_of_an_emulated_model_is_its_trace() -> None:
    from realrun import emudevice
    from realrun.graph import layer_graph

    ref = "emulated:resnet50;batch=8;dilation=1;bytes=16"
    run = load_run_trace(ref)
    with torch.device("meta"):
        model = emudevice.build(ref)
    x = torch.empty(8, emudevice.input_elements(run)[0], device="meta")
    graph = layer_graph(model, (x,))
    assert [(g.param_bytes, g.activation_bytes) for g in graph.layers] == [
        (lay.param_bytes, lay.activation_bytes) for lay in run.layers
    ]
    assert [g.name for g in graph.layers[1:]] == [lay.name for lay in run.layers[1:]]


@pytest.mark.parametrize("stages", [3, 4, 8])
def test_a_pipelines_real_stage_boundaries_carry_the_simulators_bytes(stages: int) -> None:
    # GNMT has what a chain lacks: unused LSTM states (sinks that a real model drops), an
    # input that a decoder stage reads, a layer without predecessors
    from analysis.emulated import predict
    from realrun import emudevice
    from realrun.job import pipeline_of
    from realrun.stages import split_model
    from realrun.usermodel import resolve_model

    ref = "emulated:gnmt;batch=96;dilation=1;bytes=8"
    p = predict(ref, "gpipe", stages, {}, "tests/data/calibrated-1Gbps.yaml", 1.25e9)
    pl = pipeline_of(p.config)
    micro = 96 // pl["microbatches"]
    with torch.device("meta"):
        model = emudevice.build(ref)
    split = split_model(model, pl["stage_layers"], resolve_model(ref).example_inputs(micro, "meta"))
    real = [sum(c.nbytes for c in b) * pl["microbatches"] for b in split.boundaries]
    assert real == pl["out_bytes"][:-1]
    assert len(real) == stages - 1


# ---- the simulator's side -----------------------------------------------------------------


def test_an_emulated_host_computes_off_the_shared_cores() -> None:
    """Four ranks on two shared cores: CPU ranks' compute takes turns, emulated devices'
    does not."""
    from analysis.emulated import predict

    ref = "emulated:resnet18;batch=256;dilation=1;bytes=50"
    one = predict(ref, "dp", 1, {}, "tests/data/calibrated-1Gbps.yaml", None)
    four = predict(ref, "dp", 4, {}, "tests/data/calibrated-1Gbps.yaml", None)
    compute = load_run_trace(ref).compute_s
    assert one.run_iteration_time_s == pytest.approx(compute, rel=0.05)
    assert four.run_iteration_time_s < 1.3 * one.run_iteration_time_s


@pytest.mark.parametrize("params", [4_000_000, 10_000_000])
def test_a_device_hosts_exchange_overlaps_its_compute(tmp_path, params) -> None:
    """Gossip exchanging weights on two device hosts: the rank's ``isend`` of its model
    returns at once (gloo's transport thread writes it; measured, tests/test_p2p.py and
    docs/emulated_devices.md), so the exchange overlaps the next iteration's compute and
    an iteration takes the longer of the two, even for a model larger than the socket
    buffer."""

    from analysis.emulated import emulated_preset, predict
    from analysis.resolve import load_preset
    from simcore.units import parse_rate, parse_size
    from traces.jsonfmt import save

    layers = (
        Layer("data", 0.0, 0.0, 0, 64 * 4, kind="input"),
        Layer("big", 0.4, 0.6, params, 64 * 4),
    )
    save(Trace(TraceMeta("big", "V100", 64), layers, ((0, 1),)), tmp_path / "big.json")
    rate = 12.5e6  # 100 Mbit/s
    calib = "tests/data/calibrated-1Gbps.yaml"
    preset = emulated_preset(load_preset(calib), rate)
    goodput = parse_rate(preset["network"]["bandwidth_bytes_per_s"])
    assert 2 * params > parse_size(preset["host"]["socket_buffer_bytes"])  # weights and momentum
    ref = f"emulated:{tmp_path / 'big.json'};batch=64;dilation=1;bytes=1"
    p = predict(ref, "gossip", 2, {}, calib, rate, iterations=4)
    assert p.run_iteration_time_s == pytest.approx(max(1.0, 2 * params / goodput), rel=0.1)


def test_a_prediction_with_drawn_uplinks_is_the_median_seed(tmp_path) -> None:
    """A calibration whose concurrent flows were measured uneven (``network.flow_spread``):
    the prediction simulates :data:`analysis.emulated.SEEDS` draws of the uplinks' rates
    and takes the median; a wire-bound ring all-reduce waits for its slowest uplink, so
    every draw is slower than the links at a lone flow's rate."""
    import yaml

    from analysis.emulated import SEEDS, predict
    from analysis.resolve import load_preset
    from traces.jsonfmt import save

    layers = (
        Layer("data", 0.0, 0.0, 0, 64 * 4, kind="input"),
        Layer("big", 0.04, 0.06, 4_000_000, 64 * 4),
    )
    save(Trace(TraceMeta("big", "V100", 64), layers, ((0, 1),)), tmp_path / "big.json")
    ref = f"emulated:{tmp_path / 'big.json'};batch=64;dilation=1;bytes=1"
    calib = "tests/data/calibrated-1Gbps.yaml"
    even = predict(ref, "dp", 4, {}, calib, 12.5e6, iterations=3)
    assert even.seed_times_s == ()
    preset = load_preset(calib)
    preset["network"] = {**preset["network"], "flow_share": 0.95, "flow_spread": 0.05}
    uneven_file = tmp_path / "uneven.yaml"
    uneven_file.write_text(yaml.safe_dump(preset), encoding="utf-8")
    uneven = predict(ref, "dp", 4, {}, str(uneven_file), 12.5e6, iterations=3)
    times = uneven.seed_times_s
    assert len(times) == SEEDS and list(times) == sorted(times) and times[0] < times[-1]
    assert uneven.iteration_time_s == times[SEEDS // 2]
    assert times[0] > even.iteration_time_s


def test_a_run_above_the_cpu_threshold_is_flagged() -> None:
    from realrun.machine import MACHINE_STATES
    from realrun.metrics import CPU_FLAG_SHARE, emulation_columns, machine_busy_share

    def states(busy: float, idle: float) -> list[float]:
        v = [0.0] * len(MACHINE_STATES)
        v[MACHINE_STATES.index("user")] = busy
        v[MACHINE_STATES.index("idle")] = idle
        return v

    ranks = [{"machine_at_end": {"0": states(0, 0), "3": states(1.9, 0.1)}}]
    busy = machine_busy_share(ranks, 0, 3)
    assert busy == pytest.approx(0.95) and busy > CPU_FLAG_SHARE
    result = {"iteration_time_s": 2.0, "global_batch_size": 8, "machine_cpu_busy_share": busy}
    cols = emulation_columns("emulated:resnet50;batch=4;dilation=10;bytes=2", result)
    assert cols["cpu_flagged"] and cols["emulated_iteration_time_s"] == pytest.approx(0.2)
    quiet = emulation_columns(
        "emulated:resnet50;batch=4;dilation=10;bytes=2",
        dict(result, machine_cpu_busy_share=0.2),
    )
    assert not quiet["cpu_flagged"]

    from dtsim.cli.real import emulated_rows

    row = dict(
        result, **cols, predicted_iteration_time_s=0.21, prediction_rel_err=0.05,
        prediction_calibration="x",
    )  # fmt: skip
    assert "FLAGGED" in dict(emulated_rows(row))["machine CPU"]


# ---- real runs of every scheme family on 8 emulated devices --------------------------------


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """``sim ARGS`` through the console script's entry (errors: one line, exit code)."""
    from dtsim.cli import main

    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


def _real(capsys, args: list[str]) -> dict:
    code, out, err = _main(capsys, "real", "--device", "emulated", "--json", *args)
    assert code == 0, err
    return json.loads(out[out.index("{") :])


@pytest.mark.parametrize(
    "scheme,extra",
    [("dp", []), ("p3", ["--set", "scheme.servers=2"]), ("gossip", []), ("gpipe", [])],
)
def test_eight_emulated_ranks_of_each_family_move_the_simulators_bytes(
    capsys, scheme: str, extra: list[str]
) -> None:
    r = _real(
        capsys,
        [
            "--model", "resnet18", "--gpus", "8", "--scheme", scheme, "--batch-size", "64",
            "--byte-scale", "50", "--dilation", "10", "--iterations", "2", "--calibration",
            "tests/data/calibrated-1Gbps.yaml", *extra,
        ]
    )  # fmt: skip
    assert r["device_type"] == "emulated" and r["gpus"] == 8
    from analysis.validation.rows import without_shuffle_labels

    r = without_shuffle_labels(r)  # gossip's shuffle sends labels, which no trace has
    assert r["comm_bytes_per_iteration"] == pytest.approx(
        r["predicted_comm_bytes_per_iteration"], rel=1e-9
    )
    assert r["emulated_iteration_time_s"] > 0 and r["machine_cpu_busy_share"] is not None
    if not r["cpu_flagged"]:  # a flagged run is not a GPU cluster's; unshaped: a sanity bound
        assert abs(r["prediction_rel_err"]) < 0.5


def test_spectrains_backward_on_predicted_weights_takes_the_traces_time(capsys, tmp_path) -> None:
    # a GPU implementation differentiates the forward's graph with the backward's
    # predicted weights; re-running the forward first would add a forward to every backward
    keep = tmp_path / "keep"
    ref_args = ["--model", "resnet18", "--batch-size", "64", "--byte-scale", "50"]
    r = _real(
        capsys,
        [
            *ref_args, "--gpus", "4", "--scheme", "spectrain", "--dilation", "10",
            "--iterations", "2", "--calibration", "tests/data/calibrated-1Gbps.yaml",
            "--keep", str(keep),
        ]
    )  # fmt: skip
    records = json.loads((keep / "records.json").read_text())
    job = records["job"]
    from analysis.emulated import predict
    from realrun.job import pipeline_of

    p = predict(job["model"], "spectrain", 4, {}, "tests/data/calibrated-1Gbps.yaml", None)
    pipe = pipeline_of(p.config)
    assert job["pipeline"]["stage_layers"] == pipe["stage_layers"]  # the prediction's stages
    trace = load_run_trace(job["model"])
    share = 1 / pipe["microbatches"]
    for rank in records["ranks"]:
        layers = [trace.layers[i] for i in pipe["stage_layers"][rank["stage"]]]
        layers = [lay for lay in layers if lay.kind != "input"]
        want_f = sum(lay.forward_share_s(share) for lay in layers)
        want_b = sum(lay.backward_share_s(share) for lay in layers)
        spans = [s for s in rank["spans"] if s[1] == "compute" and s[2] in ("forward", "backward")]
        for kind, want in (("forward", want_f), ("backward", want_b)):
            took = [s[5] - s[4] for s in spans if s[2] == kind]
            # the median: a pass right after an oversleep starts a little early (the clock's
            # credit), and one on a busy machine ends late
            assert took and statistics.median(took) == pytest.approx(want, rel=0.15), (
                rank["stage"],
                kind,
            )
    assert r["gpus"] == 4


def test_bad_emulated_input_is_one_line(capsys) -> None:
    for args, word in (
        (["--model", "no_such_trace"], "--model"),
        (["--model", "resnet50", "--dilation", "0.5"], "--dilation"),
        (["--model", "resnet50", "--byte-scale", "1e12"], "--byte-scale"),
        (["--model", "resnet50", "--calibration", "nope.yaml"], "--calibration"),
    ):
        code, out, err = _main(capsys, "real", "--device", "emulated", *args)
        assert code == 2, (args, out, err)
        assert word in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _out, err = _main(capsys, "real", "--model", "mlp_small", "--dilation", "4")
    assert code == 2 and "--device emulated" in err


# ---- sim validate --device emulated --------------------------------------------------------


def test_the_seed_matrix_covers_every_scheme_and_large_clusters(capsys) -> None:
    from analysis.emulated_validation import SEED_MATRIX
    from simcore.scheme_names import ORDER

    assert len(SEED_MATRIX) >= 24
    assert set(ORDER[:8]) <= {c.scheme for c in SEED_MATRIX}  # the eight of the papers
    assert {8, 16} <= {c.gpus for c in SEED_MATRIX}
    code, out, err = _main(capsys, "validate", "--device", "emulated", "--dry-run")
    assert code == 0, err
    assert out.startswith(f"{len(SEED_MATRIX)} cases")
    code, out, err = _main(
        capsys, "validate", "--device", "emulated", "--schemes", "dp,gossip", "--dry-run"
    )
    assert code == 0 and out.startswith("9 cases") and "\n  ps-" not in out, err
    code, _out, err = _main(capsys, "validate", "--device", "emulated", "--schemes", "dpp")
    assert code == 2 and "--schemes: dpp" in err and "gossip" in err


def test_a_pipeline_case_its_micro_batches_cannot_split_is_not_registered() -> None:
    from dataclasses import replace

    from analysis.emulated_validation import UNSEEN_MATRIX, predict_case, resolve
    from simcore.config import ConfigError

    case = replace(next(c for c in UNSEEN_MATRIX if c.scheme == "pipedream"), batch_size=128)
    with pytest.raises(ConfigError, match="cannot run for real: batch size 128"):
        predict_case(case, resolve(case), "tests/data/calibrated-1Gbps.yaml")


@pytest.mark.parametrize("name", ["unseen", "unseen2"])
def test_an_unseen_matrix_is_other_cases_of_every_family(name) -> None:
    from analysis.emulated_validation import MATRICES

    others = {c.case_id for m, cases in MATRICES.items() if m != name for c in cases}
    assert not others & {c.case_id for c in MATRICES[name]}
    assert {"dp", "ps", "gossip", "mp", "gpipe", "pipedream", "spectrain", "zb-h1"} <= {
        c.scheme for c in MATRICES[name]
    }


def test_the_schedules_matrix_runs_every_schedule_on_each_workload_and_only_there(
    tmp_path,
) -> None:
    pd = pytest.importorskip("pandas", reason="the report reads results with pandas")
    from analysis.emulated_report import zero_bubble
    from analysis.emulated_validation import MATRICES, SCHEDULE_NAMES, SCHEDULES_MATRIX

    others = {c.case_id for m, cases in MATRICES.items() if m != "schedules" for c in cases}
    assert not others & {c.case_id for c in SCHEDULES_MATRIX}
    by_workload: dict[tuple, set[str]] = {}
    for c in SCHEDULES_MATRIX:
        by_workload.setdefault((c.trace, c.gpus, c.bandwidth), set()).add(c.scheme)
    assert len(by_workload) == 3 and all(v == set(SCHEDULE_NAMES) for v in by_workload.values())
    # the report's comparison: 1F1B's time over each schedule's, measured / predicted
    rows = [
        {"case_id": s, "status": "ok", "scheme": s, "trace": "gnmt", "gpus": 4,
         "bandwidth": "25Gbps", "real_iteration_time_s": t, "predicted_iteration_time_s": p}
        for s, t, p in (("1f1b", 1.2, 1.0), ("zb-h1", 1.0, 0.8), ("zbv", 1.5, 1.0))
    ]  # fmt: skip
    text = zero_bubble(pd.DataFrame(rows))
    line = next(x for x in text.splitlines() if x.startswith("| gnmt"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    names = [s for s in SCHEDULE_NAMES if s != "1f1b"]
    assert cells[3 + names.index("zb-h1")] == "1.20x / 1.25x"
    assert cells[3 + names.index("zbv")] == "0.80x / 1.00x"
    assert cells[3 + names.index("dualpipev")] == "-"
    assert "No rows" in zero_bubble(pd.DataFrame(rows[1:]))


def test_the_scaling_matrix_dilates_growing_host_work_beyond_8_ranks() -> None:
    from analysis.emulated_validation import SCALING_MATRIX, scaling_dilation

    k = {(c.scheme, c.gpus): c.dilation for c in SCALING_MATRIX}
    assert {n for _s, n in k} == {2, 4, 8, 16}
    assert k["p3", 8] == k["p3", 4] == 50 and k["p3", 16] == 100
    assert k["gpipe", 8] == 10 and k["gpipe", 16] == 20
    assert k["dp", 16] == k["gossip", 16] == 10  # host work per rank, not per cluster
    assert scaling_dilation("p3", 32) == 200


def test_predictions_are_registered_once_and_scored_as_written(tmp_path) -> None:
    from analysis import emulated_validation as ev
    from simcore.config import ConfigError

    case = ev.EmuCase("dp", "resnet18", 2, "10Gbps", 10.0, (), 64, 2)
    other = ev.EmuCase("dp", "resnet18", 4, "10Gbps", 10.0, (), 64, 2)
    calib = "tests/data/calibrated-1Gbps.yaml"
    data = ev.register([case], str(tmp_path), calib)
    entry = data["cases"][case.case_id]
    assert entry["predicted_iteration_time_s"] > 0 and data["calibration_sha256"]
    assert ev.register([case], str(tmp_path), calib) == data  # read back, not remade
    with pytest.raises(ConfigError, match="never rewritten"):
        ev.register([case, other], str(tmp_path), calib)

    def result(t: float, busy: float, nbytes: float) -> dict:
        return {
            "emulated_iteration_time_s": t, "machine_cpu_busy_share": busy,
            "cpu_flagged": busy > 0.5, "comm_bytes_per_iteration": nbytes,
            "gpu_utilization": 0.9,
        }  # fmt: skip

    predicted = entry["predicted_iteration_time_s"]
    sim_bytes = entry["predicted_comm_bytes_per_iteration"]
    row = ev.score_case(case, entry, [result(predicted * 1.1, 0.3, sim_bytes)] * 2)
    assert row["status"] == "ok" and row["bytes_exact"]
    assert row["prediction_rel_err"] == pytest.approx(1 / 1.1 - 1)
    flagged = ev.score_case(case, entry, [result(predicted, 0.8, sim_bytes + 4)])
    assert flagged["status"] == "flagged" and not flagged["bytes_exact"]
    s = ev.score([row, flagged, {"status": "failed"}])
    assert (s.counted, s.flagged, s.failed, s.bytes_exact) == (1, 1, 1, 1)
    assert s.median_abs_err == pytest.approx(abs(1 / 1.1 - 1))

    def broken(_job, _rate, _repeats):
        raise RuntimeError("rank 1 hung")

    rows = ev.run_cases([case], str(tmp_path), data, calib, runner=broken)
    assert rows[0]["status"] == "failed" and "rank 1 hung" in rows[0]["error"]
    # a finished case (failed included) is not run again
    assert ev.run_cases([case], str(tmp_path), data, calib, runner=None) == rows


def test_prediction_plot_and_report_read_validation_results(tmp_path) -> None:
    pd = pytest.importorskip("pandas", reason="the plots read results with pandas")
    pytest.importorskip("matplotlib", reason="plots need matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from analysis.emulated_report import emulated_section
    from analysis.plots import plot_results, save_figure

    rows = []
    for scheme in ("dp", "gossip", "ps", "p3", "gpipe"):
        for n in (2, 4, 8):
            real, pred = 1.0 + 0.1 * n, 1.0 + 0.11 * n
            rows.append({
                "case_id": f"{scheme}-{n}", "status": "ok", "scheme": scheme,
                "trace": "resnet50", "gpus": n, "bandwidth": "10Gbps",
                "real_iteration_time_s": real, "predicted_iteration_time_s": pred,
                "real_speedup": n / real, "predicted_speedup": n / pred,
                "real_scaling_efficiency": 1 / real, "predicted_scaling_efficiency": 1 / pred,
            })  # fmt: skip
    rows.append(dict(rows[0], case_id="flagged", status="flagged", gpus=16))
    path = tmp_path / "results.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    fig = plot_results(str(path), "prediction")
    save_figure(fig, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0
    ax = fig.axes[0]
    assert sorted(ax.get_xticks()) == [2, 4, 8]  # the flagged 16-rank case is left out
    text = emulated_section([str(tmp_path)])
    assert "P3 over the parameter server" in text and "1.00x" in text  # same times
    assert "gpipe" in text and "No rows" in text  # SpecTrain was not run


@pytest.mark.parametrize(
    "scheme,extra",
    [
        ("gpipe", []),
        ("gpipe", ["--set", "scheme.recompute=true"]),
        ("1f1b", []),
        ("pipedream", []),
        ("zb-h1", []),
        ("interleaved", []),
        ("looped-bfs", []),
        ("zb-interleaved", []),
        ("zbv", []),
        ("dualpipev", []),
    ],
)
def test_a_pipeline_ranks_memory_and_bytes_are_the_simulators(
    capsys, scheme: str, extra: list[str]
) -> None:
    """Each rank's peak of what its micro-batches in flight keep for their backward
    (inputs and the layers' outputs, the trace's bytes on an emulated device) and of its
    stashed weight versions, and the bytes sent per iteration, equal ``sim run``'s for
    the same stages and schedule."""
    r = _real(
        capsys,
        [
            "--model", "resnet18", "--gpus", "2", "--scheme", scheme, "--batch-size", "32",
            "--dilation", "10", "--iterations", "2", "--calibration",
            "tests/data/calibrated-1Gbps.yaml", *extra,
        ]
    )  # fmt: skip
    assert min(r["activation_peak_bytes"]) > 0
    assert r["activation_peak_bytes"] == r["predicted_activation_peak_bytes"]
    assert r["stash_peak_bytes"] == r["predicted_stash_peak_bytes"]
    assert r["comm_bytes_per_iteration"] == r["predicted_comm_bytes_per_iteration"]
    from dtsim.cli.real import _predicted_memory

    assert _predicted_memory(r) == " (sim run's, to the byte)"  # what `sim real` prints
    off = _predicted_memory(dict(r, predicted_activation_peak_bytes=[1024, 3072]))
    assert off.startswith("; sim run: ") and off.endswith(" / 3 KiB")
    if scheme == "pipedream":
        assert r["stash_peak_bytes"][0] > 0  # stage 0 keeps an older version in flight
