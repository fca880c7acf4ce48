"""``sim calibrate`` (realrun/calibration/): the fits on synthetic data, a real local
calibration whose file ``sim run --topology`` reads, a shaped netns calibration, and the
command line's errors."""

from __future__ import annotations

import json
import math
import os
import secrets
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dtsim.cli import main
from realrun import linkcpu
from realrun.calibrated import at_rate, burst_payload_bytes, format_rate_text
from realrun.calibration.fits import (
    fit_cpu_cost,
    fit_latency_bandwidth,
    fit_line,
    fit_shaped_link,
    send_buffer_bytes,
)
from realrun.calibration.preset import write_calibration
from realrun.calibration.ranks import MESSENGER_SIZES_BYTES, element_count
from realrun.calibration.run import calibrate
from realrun.machine import tcp_send_buffer_bytes
from realrun.scheduler import BALANCE_GRID_S, CYCLES
from simcore.topology import TopologySpec, build_topology
from simcore.units import parse_rate, parse_size, parse_time
from tests.helpers import netns_unavailable_reason

SIZES = np.array([4, 64, 1024, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20], dtype=float)


def run_main(capsys: Any, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return ex.value.code, out, err


# ---------------------------------------------------------------------------------------
# Fits


def test_fit_line_recovers_an_exact_line() -> None:
    fit = fit_line(SIZES, 50e-6 + SIZES / 120e6)
    assert fit.intercept == pytest.approx(50e-6, rel=1e-9)
    assert fit.slope == pytest.approx(1 / 120e6, rel=1e-9)
    assert fit.residual_rel_max < 1e-9
    assert fit.points == len(SIZES)


def test_robust_fit_ignores_a_disturbed_point_that_plain_least_squares_follows() -> None:
    y = 80e-6 + SIZES / 100e6
    y[2] *= 20  # a 1 KiB message that waited for another process's time slice
    y[7] *= 1.5
    robust = fit_line(SIZES, y)
    plain = fit_line(SIZES, y, robust=False)
    assert robust.intercept == pytest.approx(80e-6, rel=0.05)
    assert robust.slope == pytest.approx(1 / 100e6, rel=0.05)
    assert abs(plain.intercept - 80e-6) > 5 * abs(robust.intercept - 80e-6)
    assert robust.weights_min < 0.2  # the disturbed point was down-weighted


def test_fits_stay_non_negative() -> None:
    # times that fall with size would give a negative slope: clamped to 0
    fit = fit_line([1, 2, 3, 4], [4.0, 3.0, 2.0, 1.0])
    assert fit.slope == 0.0 and fit.intercept > 0
    # a line through the origin and below: intercept clamped to 0
    fit = fit_line([1, 2, 3, 4], [0.5, 1.5, 2.5, 3.5], relative=False, robust=False)
    assert fit.intercept == 0.0 and fit.slope > 0
    with pytest.raises(ValueError, match="no bandwidth"):
        fit_latency_bandwidth([4, 8, 16], [1.0, 0.9, 0.8])


def test_a_few_scattered_points_still_give_a_bandwidth() -> None:
    """Three loopback sizes measured on a busy machine: too few to call one an outlier,
    so the plain fit is kept rather than a slope of zero."""
    lat, goodput, fit = fit_latency_bandwidth([4, 65536, 1 << 20], [277e-6, 690e-6, 966e-6])
    assert goodput > 0 and lat > 0 and fit.weights_min == 1.0
    many = fit_line(SIZES[:4], [1.0, 1.0, 1.0, 9.0])  # four points: not robust either
    assert many.slope > 0


def test_fit_line_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="two distinct"):
        fit_line([5, 5, 5], [1, 2, 3])
    with pytest.raises(ValueError, match="positive"):
        fit_line([1, 2], [0.0, 1.0])
    with pytest.raises(ValueError, match="same length"):
        fit_line([1, 2, 3], [1.0, 2.0])
    with pytest.raises(ValueError, match="sigma"):
        fit_line([1, 2], [1.0, 2.0], sigma=[1.0, 0.0])


@settings(max_examples=60, deadline=None)
@given(
    latency_s=st.floats(1e-6, 5e-3),
    rate=st.floats(1e6, 5e9),
    noise=st.floats(0.0, 0.03),
    seed=st.integers(0, 2**31 - 1),
)
def test_latency_and_bandwidth_are_recovered_from_noisy_times(
    latency_s: float, rate: float, noise: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    t = (latency_s + SIZES / rate) * (1 + noise * rng.uniform(-1, 1, len(SIZES)))
    lat, goodput, fit = fit_latency_bandwidth(SIZES, t)
    # a relative error e on every point moves the fit by about e of the times it comes from
    assert goodput == pytest.approx(rate, rel=3 * noise + 1e-6)
    assert lat == pytest.approx(latency_s, rel=3 * noise + 1e-6, abs=3 * noise * t.min() + 1e-12)
    assert fit.residual_rel_max <= 4 * noise + 1e-6


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(5e6, 2e9), latency_s=st.floats(10e-6, 1e-3))
def test_the_tbf_bucket_is_fitted_out(rate: float, latency_s: float) -> None:
    """A shaped link passes its bucket at once: t = L + max(0, n - burst) / rate. Fitting
    with the burst recovers the sustained rate; ignoring it overestimates the rate."""
    burst = burst_payload_bytes(rate)
    t = latency_s + np.maximum(SIZES - burst, 0) / rate
    lat, goodput, _ = fit_latency_bandwidth(SIZES, t, burst)
    assert goodput == pytest.approx(rate, rel=1e-6)
    assert lat == pytest.approx(latency_s, rel=1e-6)
    naive_rate = 1 / fit_line(SIZES, t, robust=False).slope
    assert naive_rate > rate * 1.0001


def test_the_send_buffer_is_what_a_big_send_did_not_wait_for() -> None:
    """A blocking send of n bytes returns once all but the buffer has gone at the goodput:
    the buffer is n - returned * goodput, the median over the big sizes (smaller ones are
    taken whole by the kernel and say nothing); none measured: tcp_wmem's maximum."""
    goodput, buffer = 25e6, 1_300_000
    rows = [(n, max(0.0, n - buffer) / goodput) for n in (1 << 20, 4 << 20, 16 << 20)]
    assert send_buffer_bytes(rows, goodput) == buffer
    rows.append((64 << 20, ((64 << 20) - 3 * buffer) / goodput))  # one size disturbed
    assert send_buffer_bytes(rows, goodput) == buffer  # the median shrugs it off
    assert send_buffer_bytes([(4 << 20, 1e-4)], goodput) == (4 << 20) - 2500  # capped at n
    assert send_buffer_bytes([(4 << 20, 10.0)], goodput) == 0
    assert send_buffer_bytes([(1 << 20, 0.0)], goodput) == tcp_send_buffer_bytes()
    assert send_buffer_bytes([], goodput) == tcp_send_buffer_bytes()


def test_a_shaped_links_latency_is_its_tiny_messages_time() -> None:
    """Medium messages slower than the bucket model (as on this machine's tbf links) pull
    a free intercept up; the latency is read from the tiny messages instead (the
    shortest: a disturbed size is only ever slower), the goodput stays the fit's."""
    rate, latency_s = 25e6, 110e-6
    burst = burst_payload_bytes(rate)
    t = latency_s + np.maximum(SIZES - burst, 0) / rate
    t[(SIZES > 4096) & (SIZES < 1 << 20)] += 250e-6  # the medium sizes
    t[SIZES == 64] += 2e-3  # one tiny size disturbed
    lat, goodput, fit = fit_shaped_link(SIZES, t, burst, 0.01 * t)
    assert lat == pytest.approx(latency_s)
    assert goodput == pytest.approx(fit_latency_bandwidth(SIZES, t, burst, 0.01 * t)[1])
    assert fit.intercept == lat and fit.residual_rel_max > 0
    # without sizes of 1 KiB or less: the plain fit
    big = SIZES > 1024
    assert fit_shaped_link(SIZES[big], t[big], burst, 0.01 * t[big])[0] == pytest.approx(
        fit_latency_bandwidth(SIZES[big], t[big], burst, 0.01 * t[big])[0]
    )


def test_cpu_costs_are_recovered() -> None:
    message_cpu_s, per_byte = 30e-6, 0.25e-9
    cpu = message_cpu_s + SIZES * per_byte
    cpu[3] *= 3  # one disturbed size
    m, c, fit = fit_cpu_cost(SIZES, cpu)
    assert m == pytest.approx(message_cpu_s, rel=0.05)
    assert c == pytest.approx(per_byte, rel=0.05)
    assert fit.residual_rel_max > 0.6  # the disturbed point is reported, not hidden


def test_rate_texts_read_back() -> None:
    for rate in (3.7, 999.0, 1.234e6, 119.6e6, 12.5e9, 3e12):
        assert parse_rate(format_rate_text(rate)) == pytest.approx(rate, rel=1e-3)


# ---------------------------------------------------------------------------------------
# Real calibrations


def _check_preset(preset: dict[str, Any], path: str) -> None:
    """The file follows the schema and every value with a unit reads back."""
    write_calibration(preset, path)
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert list(data)[:8] == [
        "name",
        "summary",
        "gpu",
        "host",
        "gloo",
        "box",
        "network",
        "measured",
    ]
    assert data["gpu"]["kind"] == "cpu"
    assert parse_size(data["gpu"]["memory_bytes"]) > 0
    assert parse_rate(data["gpu"]["memory_bandwidth_bytes_per_s"]) > 0
    assert data["gpu"]["peak_flop_per_s"] > 0
    host = data["host"]
    assert host["cores"] == len(os.sched_getaffinity(0)) and host["shared"] is True
    for key in ("message_cpu_s", "copy_cpu_s_per_byte", "reduce_cpu_s_per_byte", "wakeup_s"):
        assert isinstance(host[key], float) and host[key] >= 0
    assert host["wakeup_s"] == data["measured"]["fits"]["wakeup_s"]
    assert host["message_cpu_s"] > 0 and host["reduce_cpu_s_per_byte"] > 0
    assert parse_size(data["gloo"]["segment_bytes"]) == 1 << 20
    net = data["network"]
    goodput = parse_rate(net["bandwidth_bytes_per_s"])
    assert goodput == pytest.approx(data["measured"]["fits"]["goodput_bytes_per_s"], rel=1e-3)
    # the latency is per link; the route between two hosts adds up to the measured one
    topo = build_topology(TopologySpec(data, 2))
    route = topo.route(topo.gpus[0], topo.gpus[1])
    assert sum(link.latency for link in route) == pytest.approx(
        data["measured"]["fits"]["latency_s"], rel=1e-3, abs=1e-9
    )
    m = data["measured"]
    assert m["date"].endswith("Z") and m["torch"].startswith("2.")
    for row in m["p2p"]:
        assert set(row) == {
            "bytes",
            "shaped_s",
            "unshaped_s",
            "cpu_s",
            "shaped_machine_cpu_s",
            "shaped_send_return_s",
        }
        assert row["unshaped_s"] > 0 and row["cpu_s"] > 0
    for row in m["allreduce"]:
        assert set(row) == {"ranks", "bytes", "time_s", "spread_s"}
        assert row["time_s"] > 0 and row["spread_s"] >= 0


@pytest.mark.real
def test_local_calibration_writes_a_topology_sim_run_reads(tmp_path: Any, capsys: Any) -> None:
    from analysis.resolve import load_preset

    pytest.importorskip("torch")
    steps: list[tuple[int, int]] = []
    # sizes far enough apart that loopback's times grow with them through the noise of a
    # busy machine (64 KiB and 1 MiB alone were once inside it)
    preset = calibrate(
        "local",
        sizes_bytes=(4, 1 << 20, 8 << 20),
        repeats=2,
        allreduce_ranks=(2,),
        progress=lambda done, total, _what: steps.append((done, total)),
    )
    assert steps and steps[-1][0] == steps[-1][1]
    assert [d for d, _ in steps] == list(range(1, len(steps) + 1))
    path = str(tmp_path / "calib.yaml")
    _check_preset(preset, path)
    assert preset["name"] == "local-calibrated"
    assert preset["measured"]["tbf_rate"] is None
    assert [(r["ranks"], r["bytes"]) for r in preset["measured"]["allreduce"]] == [
        (2, 4),
        (2, 1 << 20),
        (2, 8 << 20),
    ]
    # the messenger ping-pong's CPU is measured: what a parameter server's message costs
    # each end beyond a plain send (its threads' Python), never negative
    assert all(r["cpu_s"] > 0 for r in preset["measured"]["messenger"])
    assert preset["host"]["p2p_message_cpu_s"] >= 0
    assert preset["host"]["p2p_copy_cpu_s_per_byte"] >= 0
    # beside a computing main thread, the other threads' CPU per message is kept too
    busy = [r for r in preset["measured"]["messenger"] if r["busy"]]
    assert busy and all(r["messages_cpu_s"] >= 0 for r in busy)
    # a pipeline's isend beside compute: every size measured, fitted into the file
    assert [r["bytes"] for r in preset["measured"]["isend"]] == [
        4 * element_count(n) for n in MESSENGER_SIZES_BYTES
    ]
    assert all(r["isend_cpu_s"] > 0 for r in preset["measured"]["isend"])
    for key in ("isend_s", "posted_cpu_s"):
        assert preset["host"][key] == preset["measured"]["fits"][key] >= 0
    # and fitted into the busy cost per message
    assert preset["host"]["p2p_message_busy_cpu_s"] >= 0
    assert (
        preset["host"]["p2p_message_busy_cpu_s"]
        == preset["measured"]["fits"]["p2p_message_busy_cpu_s"]
    )
    # the scheduler benchmark ran first, one process more than cores, and its fitted
    # load-balancing delay is the file's host.balance_s
    sched = preset["measured"]["scheduler"]
    assert [r["processes"] for r in sched] == [preset["host"]["cores"] + 1] * len(CYCLES)
    assert all(r["cycles"] > 0 for r in sched)
    assert preset["host"]["balance_s"] == preset["measured"]["fits"]["balance_s"]
    assert preset["host"]["balance_s"] in BALANCE_GRID_S
    loaded = load_preset(path)
    assert loaded["name"] == "local-calibrated"
    code, out, err = run_main(
        capsys, "run", "--topology", path, "--gpus", "2", "--scheme", "dp",
        "--model", "resnet18-cpu", "--iterations", "2", "--json",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["topology"] == "local-calibrated" and result["iteration_time_s"] > 0


_REASON = netns_unavailable_reason()


@pytest.mark.real
@pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")
def test_netns_calibration_measures_goodput_below_the_tbf_rate(
    tmp_path: Any, monkeypatch: Any
) -> None:
    from realrun.netns import list_ours

    pytest.importorskip("torch")
    import realrun.flows

    prefix = f"dtcb{secrets.token_hex(3)}"
    monkeypatch.setenv("DTSIM_NETNS_PREFIX", prefix)
    monkeypatch.setattr(realrun.flows, "RATE_FRACTIONS", (0.25, 1.0))  # two rates, short
    monkeypatch.setattr(realrun.flows, "ROUNDS", 1)
    rate = parse_rate("200Mbps")
    preset = calibrate(
        "netns",
        rate,
        sizes_bytes=(4, 1024, 1 << 20, 4 << 20),
        repeats=3,  # a median of three outlasts one round the machine delayed; of two not
        allreduce_ranks=(),
        flow_hosts=3,
    )
    assert not list_ours(prefix)  # every cluster is gone
    _check_preset(preset, str(tmp_path / "c.yaml"))
    goodput = preset["measured"]["fits"]["goodput_bytes_per_s"]
    assert 0.8 * rate < goodput <= 1.0 * rate
    assert preset["name"] == "netns-200Mbps-calibrated"
    assert parse_rate(preset["measured"]["tbf_rate"]) == rate
    rows = preset["measured"]["p2p"]
    big = rows[-1]
    # 4 MiB over 200 Mbit/s takes about 0.17 s one way; unshaped it is far faster
    assert big["shaped_s"] > 0.15 and big["unshaped_s"] < big["shaped_s"] / 5
    assert preset["measured"]["allreduce"] == []
    # the 4 MiB send returned before the message was through: the kernel took part of it
    assert 0 < big["shaped_send_return_s"] < big["shaped_s"]
    buffer = parse_size(preset["host"]["socket_buffer_bytes"])
    assert buffer == preset["measured"]["fits"]["socket_buffer_bytes"]
    assert 0 < buffer <= min(4 << 20, tcp_send_buffer_bytes())
    # the two-flow benchmark: the second flow's message came after both messages' bytes
    # had crossed the link, and the lead fitted to it is the file's network.lead_s (tbf
    # once let the 2 x 2 MiB through at 26.7 MB/s, 7% over its 25 MB/s rate and 12%
    # over the goodput fitted to single messages: a margin of 20%)
    sharing = preset["measured"]["sharing"]
    assert len(sharing) == 3
    for row in sharing:
        assert row["delay_s"] < row["first_s"] < row["second_s"]
        assert row["second_s"] > 0.8 * 2 * row["bytes"] / goodput
    lead = preset["measured"]["fits"]["sharing_lead_s"]
    assert 0 <= lead <= 0.04
    with open(tmp_path / "c.yaml", encoding="utf-8") as fh:
        topo = build_topology(TopologySpec(yaml.safe_load(fh), 2))
    assert topo.link_lead_s == pytest.approx(lead) and topo.link_sharing == "fair"
    # the concurrent flows: at 50 and 200 Mbit/s a round of a lone flow and a ring of
    # three; the file's flow share and spread are those at its rate, and the simulator
    # reads them; moved to 50 Mbit/s the calibration takes that rate's
    flows = preset["measured"]["flows"]
    assert [e["rate_bytes_per_s"] for e in flows] == [rate / 4, rate]
    assert all(
        len(e["rounds"]) == 1 and len(e["rounds"][0]["ring_bytes_per_s"]) == 3 for e in flows
    )
    assert 0 < topo.flow_share == preset["network"]["flow_share"] <= 1
    assert topo.flow_spread == preset["network"]["flow_spread"] >= 0
    assert all(0 <= e["machine_busy_share"] <= 1 for e in flows)
    share, spread = realrun.flows.at(flows, rate)
    assert (preset["network"]["flow_share"], topo.flow_spread) == (
        round(share, 4),
        round(spread, 4),
    )
    moved = at_rate(preset, rate / 4)["network"]
    assert moved["flow_spread"] == round(realrun.flows.at(flows, rate / 4)[1], 4)
    # the busy-cores benchmark: both sizes measured idle and busy, and the wait fitted to
    # it is the file's host.wakeup_s
    wake_rows = preset["measured"]["wakeup"]
    hosts = preset["measured"]["hosts"]
    threads = [0, *range(2, hosts + 1)]
    assert [(r["bytes"], r["threads"]) for r in wake_rows] == [
        (n, t) for n in (256 << 10, 1 << 20) for t in threads
    ]
    assert all(r["time_s"] > 0 for r in wake_rows)
    wake = preset["measured"]["fits"]["wakeup_s"]
    assert 0 <= wake <= 5e-3 and topo.host_spec is not None
    assert topo.host_spec.wakeup_s == pytest.approx(wake)
    # the link CPU benchmark: the two ranks kept the shaped link busy both ways, the
    # spinners lost more than the ranks' own CPU (the link's packet work), and that per
    # byte and end is the file's host.link_cpu_s_per_byte
    link = preset["measured"]["link_cpu"]
    assert link["bytes"] / link["seconds"] > 0.7 * 2 * goodput
    assert link["lost_cores"] > link["ranks_cores"] > 0
    per_byte = preset["measured"]["fits"]["link_cpu_s_per_byte"]
    assert per_byte == pytest.approx(
        (link["lost_cores"] - link["ranks_cores"]) / (link["bytes"] / link["seconds"]) / 2
    )
    assert topo.host_spec.link_cpu_s_per_byte == pytest.approx(per_byte) and per_byte > 0
    # ... of the round whose value is the median of all
    rounds = sorted((lost - ranks) / (b / s) / 2 for lost, ranks, b, s in link["rounds"])
    assert len(rounds) == linkcpu.ROUNDS and per_byte == pytest.approx(rounds[len(rounds) // 2])
    # two pairs at once carried more than one pair can, and their cost per byte is the
    # file's host.link_cpu_two_pairs_s_per_byte (the median round's too)
    two = link["two_pairs"]
    assert two["bytes"] / two["seconds"] > 1.2 * 2 * goodput and len(two["rounds"]) == len(rounds)
    two_per_byte = preset["measured"]["fits"]["link_cpu_two_pairs_s_per_byte"]
    assert two_per_byte == pytest.approx(linkcpu.link_cpu_s_per_byte(two))
    assert topo.host_spec.link_cpu_two_pairs_s_per_byte == pytest.approx(two_per_byte)


@pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")
def test_set_rate_shapes_and_unshapes_an_open_cluster() -> None:
    from realrun.netns import EmulatedCluster, measure_goodput

    rate = parse_rate("100Mbps")
    with EmulatedCluster(2, None, prefix=f"dtcb{secrets.token_hex(3)}") as emu:
        assert emu.qdisc_stats()[0] == {"up": {}, "down": {}}
        emu.set_rate(rate)
        assert emu.rate_bytes_per_s == rate and "drops" in emu.qdisc_stats()[1]["down"]
        assert 0.8 * rate < measure_goodput(emu, 0, 1, 2_000_000) <= rate
        emu.set_rate(None)
        assert emu.rate_bytes_per_s is None and emu.qdisc_stats()[1] == {"up": {}, "down": {}}
        assert measure_goodput(emu, 1, 0, 8_000_000) > 3 * rate


# ---------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bandwidth", "fast"], "--bandwidth: 'fast'"),
        (["--bandwidth", "10"], "--bandwidth: '10'"),
        (["--cluster", "local", "--bandwidth", "1Gbps"], "--cluster local"),
        (["--cluster", "local", "--sizes", "4,lots"], "--sizes"),
        (["--cluster", "local", "--sizes", "4,5"], "at least two different sizes"),
        (["--cluster", "local", "--allreduce-ranks", "1"], "--allreduce-ranks"),
        (["--cluster", "mars"], "--cluster"),
        (["--cluster", "local", "--hosts", "1"], "--hosts"),
        (["--cluster", "local", "--out", "/nonexistent-dir/c.yaml"], "does not exist"),
    ],
)
def test_cli_errors_are_one_line(
    capsys: Any, tmp_path: Any, monkeypatch: Any, args: list[str], needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(capsys, "calibrate", *args)
    assert code == 2
    assert needle in err and err.startswith("Error:") and err.count("\n") == 1
    assert "Traceback" not in err and not os.listdir(tmp_path)


def test_cli_without_netns_says_why_in_one_line(capsys: Any, monkeypatch: Any) -> None:
    import realrun.netns as netns
    import realrun.owner
    import realrun.stale

    def refuse() -> None:
        raise netns.NetnsUnavailable("emulated clusters need root (network namespaces); try")

    monkeypatch.setattr(netns, "check_available", refuse)
    # what dead runs left elsewhere on the machine would add its own note line
    monkeypatch.setattr(realrun.stale, "remove_stale", lambda *a: realrun.owner.Removed())
    code, _, err = run_main(capsys, "calibrate", "--bandwidth", "1Gbps")
    assert code == 2 and err.count("\n") == 1 and "need root" in err


def test_bad_arguments_name_the_argument() -> None:
    with pytest.raises(ValueError, match="cluster"):
        calibrate("mars")
    with pytest.raises(ValueError, match="bandwidth"):
        calibrate("local", 1e9)
    with pytest.raises(ValueError, match="bandwidth"):
        calibrate("netns", math.inf)
    with pytest.raises(ValueError, match="repeats"):
        calibrate("local", repeats=0)
    with pytest.raises(ValueError, match="sizes"):
        calibrate("local", sizes_bytes=(4,))
    with pytest.raises(ValueError, match="allreduce_ranks"):
        calibrate("local", allreduce_ranks=(1,))


def test_the_messengers_cpu_is_a_line_over_message_sizes():
    """``fit_messenger_cpu``: the messenger's CPU per message beyond a plain send's, over
    its ping-pong sizes, is fitted as per message plus per byte (non-negative, a small
    message's excess may come out below zero); one size gives the median and no slope."""
    from realrun.calibration.fits import fit_messenger_cpu

    per_msg, per_byte = 1.2e-4, 8e-10
    sizes = [1 << 10, 64 << 10, 256 << 10, 1 << 20]
    a, b = fit_messenger_cpu([(n, per_msg + n * per_byte) for n in sizes])
    assert a == pytest.approx(per_msg, rel=1e-6) and b == pytest.approx(per_byte, rel=1e-6)
    a, b = fit_messenger_cpu([(1024, -2e-5), (65536, 5e-5), (262144, 2e-4), (1 << 20, 8e-4)])
    assert a >= 0 and b > 0
    assert fit_messenger_cpu([(1024, 3e-4), (1024, 1e-4), (1024, 2e-4)]) == (2e-4, 0.0)
    assert fit_messenger_cpu([]) == (0.0, 0.0)


def test_the_messengers_busy_cpu_is_the_per_message_part_beside_compute():
    """``busy_messenger_cpu``: the busy rows' CPU per message (``messages_cpu_s``) less a
    plain send's (per message and per byte) gives a line whose per-message part is
    ``p2p_message_busy_cpu_s``; idle rows and rows without the figure are left out, and
    without busy rows it is 0 (the idle cost stands for every load)."""
    from realrun.calibration.fits import busy_messenger_cpu

    message_cpu, copy = 1.5e-4, 3e-10
    busy, burn = 4.5e-4, 1e-9  # per message beside compute; per byte in flight
    rows = [
        {"bytes": n, "busy": True, "messages_cpu_s": message_cpu + n * copy + busy + n * burn}
        for n in (1 << 10, 64 << 10, 256 << 10, 1 << 20)
    ]
    rows += [{"bytes": 1024, "busy": False, "cpu_s": 1.0}, {"bytes": 2048, "busy": True}]
    assert busy_messenger_cpu(rows, message_cpu, copy) == pytest.approx(busy, rel=1e-6)
    assert busy_messenger_cpu(rows[-2:], message_cpu, copy) == 0.0


def test_the_isend_hold_and_the_transports_cpu_are_per_message_parts_beside_compute():
    """``isend_rows`` takes each size's medians over the two ranks; ``fit_isend`` gives
    the per-message parts of the lines through the main thread's CPU in an ``isend``
    beyond the sending end's charge, and through the other threads' CPU per end beyond
    half a message's charge (per-byte parts, the link's packet work, left out)."""
    from realrun.calibration.fits import fit_isend, isend_rows

    message_cpu, copy = 1.5e-4, 3e-10
    hold, posted, link = 3e-4, 1e-4, 2e-9
    results = [
        {
            "isend": [
                {
                    "bytes": n,
                    "shaped": True,
                    "isend_cpu_s": k * (message_cpu + n * copy + hold + n * link),
                    "off_main_cpu_s": k * ((message_cpu + n * copy) / 2 + posted + n * link),
                }
                for n in (1 << 10, 64 << 10, 256 << 10, 1 << 20)
            ]
        }
        for k in (0.5, 1.0, 1.5)  # three ranks' rows: the median is the middle one's
    ]
    rows = isend_rows(results)
    assert [r["bytes"] for r in rows] == [1 << 10, 64 << 10, 256 << 10, 1 << 20]
    assert all(r["shaped"] for r in rows)
    got_hold, got_posted = fit_isend(rows, message_cpu, copy)
    assert got_hold == pytest.approx(hold, rel=1e-6)
    assert got_posted == pytest.approx(posted, rel=1e-6)
    assert fit_isend([], message_cpu, copy) == (0.0, 0.0)
    assert isend_rows([{"rank": 0}]) == []


NETNS_PRESET = os.path.join(
    os.path.dirname(__file__), "..", "simcore", "presets", "topologies", "netns.yaml"
)


@pytest.mark.parametrize("lead_s", [0.0, 4e-3, 12.5e-3])
def test_the_link_lead_is_recovered_from_a_simulated_two_flow_benchmark(lead_s: float) -> None:
    """``fit_sharing_lead`` on rows that the simulator itself made with a lead finds that
    lead with no residual, to within a chunk's time (leads inside one chunk's time give
    the same schedule; the fit takes the smallest); the first flow finishes later the
    smaller the lead, and the second after both messages' bytes whatever the lead."""
    from realrun.calibration.fits import segment_bytes
    from realrun.calibration.ranks import SHARING_BYTES
    from realrun.calibration.simfits import fit_sharing_lead, simulate_two_flows

    with open(NETNS_PRESET, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    delays = [1.8e-3, 4.4e-3, 8.8e-3]
    rows = []
    for d in delays:
        first, second = simulate_two_flows(preset, SHARING_BYTES, d, lead_s)
        rows.append({"delay_s": d, "first_s": first, "second_s": second})
    lead, residual = fit_sharing_lead(preset, SHARING_BYTES, rows)
    goodput = parse_rate(preset["network"]["bandwidth_bytes_per_s"])
    assert lead_s - segment_bytes(preset) / goodput <= lead <= lead_s and residual < 1e-9
    burst = parse_size(preset["network"]["burst_bytes"])  # leaves at the peak speed
    for d in delays:
        fair = simulate_two_flows(preset, SHARING_BYTES, d, 0.0)
        held = simulate_two_flows(preset, SHARING_BYTES, d, 0.05)
        assert held[0] < fair[0]
        assert held[1] == pytest.approx(fair[1], rel=1e-6)
        assert fair[1] >= (2 * SHARING_BYTES - burst) / goodput
    with pytest.raises(ValueError, match="no rows"):
        fit_sharing_lead(preset, SHARING_BYTES, [])


@pytest.mark.parametrize("wakeup_s", [0.0, 0.6e-3, 2.25e-3])
def test_the_wakeup_is_recovered_from_a_simulated_busy_cores_benchmark(wakeup_s: float) -> None:
    """``fit_wakeup`` on rows that the simulator itself made with a wake-up wait finds that
    wait with no residual; busy cores slow an all-reduce down the more the longer the
    wait and the more threads compute, and idle ones not at all."""
    from realrun.calibration.ranks import WAKEUP_SIZES_BYTES
    from realrun.calibration.simfits import fit_wakeup, simulate_busy_allreduce

    with open(NETNS_PRESET, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    rows = [
        {
            "bytes": n,
            "threads": t,
            "time_s": simulate_busy_allreduce(preset, n, t, wakeup_s if t else 0.0),
        }
        for n in WAKEUP_SIZES_BYTES
        for t in (0, 2, 3, 4)
    ]
    wake, residual = fit_wakeup(preset, rows)
    assert wake == pytest.approx(wakeup_s, abs=1e-12) and residual < 1e-9
    for n in WAKEUP_SIZES_BYTES:
        waits = [simulate_busy_allreduce(preset, n, 2, w) for w in (0.0, 1e-3, 3e-3)]
        assert waits == sorted(waits) and waits[2] > waits[0]
        crowded = [simulate_busy_allreduce(preset, n, t, 1e-3) for t in (2, 3, 4)]
        assert crowded == sorted(crowded) and crowded[2] > crowded[0]
        idle = {simulate_busy_allreduce(preset, n, 0, w) for w in (0.0, 3e-3)}
        assert len(idle) == 1
    with pytest.raises(ValueError, match="no rows"):
        fit_wakeup(preset, [])


def test_one_wakeup_is_fitted_over_several_calibrations() -> None:
    """``pool_wakeup``: two calibrations whose busy-cores benchmarks show waits of 1 and
    2 ms get the one wait nearest to both (1.5 ms: the simulated slow-down is linear in
    the wait), their own fits kept; pooling again changes nothing, and a single
    calibration or one without the benchmark is left as it is."""
    from realrun.calibration.simfits import fit_wakeup_pooled, pool_wakeup, unshaped_links
    from tests.helpers import busy_cores_calibration

    a, b = busy_cores_calibration(1e-3), busy_cores_calibration(2e-3, latency_s=80e-6)
    pooled = pool_wakeup([a, b, {"name": "no benchmark"}])
    for p, own in zip(pooled, (1e-3, 2e-3), strict=False):
        fits = p["measured"]["fits"]
        assert p["host"]["wakeup_s"] == fits["wakeup_s"] == pytest.approx(1.5e-3, abs=1e-12)
        assert fits["wakeup_own_s"] == own and fits["wakeup_pooled_over"] == 2
        assert fits["wakeup_residual_s_max"] > 1e-4  # neither run is met exactly
    assert pooled[2] == {"name": "no benchmark"}
    assert a["host"]["wakeup_s"] == 1e-3  # the inputs are not changed
    assert pool_wakeup(pooled) == pooled
    assert pool_wakeup([a]) == [a]
    # each run is simulated on its own links: one run alone gives its own wait back
    f = b["measured"]["fits"]
    links = unshaped_links(b, f["unshaped_latency_s"], f["unshaped_goodput_bytes_per_s"])
    wake, residual = fit_wakeup_pooled([(links, b["measured"]["wakeup"])])
    assert wake == pytest.approx(2e-3, abs=1e-12) and residual < 1e-9


def test_busy_cores_rows_are_medians_of_rank_0s_times() -> None:
    """``wakeup_rows``: per size and number of computing threads, the median of rank 0's
    all-reduce times, in order."""
    from realrun.calibration.fits import wakeup_rows

    got = [
        {"bytes": 4096, "threads": 0, "times_s": [0.01]},
        {"bytes": 1024, "threads": 2, "times_s": [0.004, 0.009, 0.005]},
        {"bytes": 1024, "threads": 0, "times_s": [0.003, 0.001, 0.002]},
    ]
    rows = wakeup_rows([{"rank": 1, "wakeup": []}, {"rank": 0, "wakeup": got}])
    assert rows == [
        {"bytes": 1024, "threads": 0, "time_s": 0.002},
        {"bytes": 1024, "threads": 2, "time_s": 0.005},
        {"bytes": 4096, "threads": 0, "time_s": 0.01},
    ]
    assert wakeup_rows([{"rank": 0}]) == []


def test_two_flow_rows_are_medians_after_the_warm_up() -> None:
    """``sharing_rows``: per delay, medians of rank 0's start times and rank 1's arrival
    times over the rounds after the warm-up, all from the first flow's start."""
    from realrun.calibration.fits import sharing_rows

    plan = [0.01, 0.01, 0.002, 0.002, 0.002, 0.01]
    first_start = [10.0 * k for k in range(len(plan))]
    sent = {"delays_s": plan, "warmup": 2, "first_start_s": first_start,
            "second_start_s": [t + d + 1e-4 for t, d in zip(first_start, plan)]}  # fmt: skip
    firsts = [0.05, 0.05, 0.020, 0.030, 0.022, 0.018]
    got = {"delays_s": plan, "warmup": 2,
           "first_done_s": [t + f for t, f in zip(first_start, firsts)],
           "second_done_s": [t + 0.034 for t in first_start]}  # fmt: skip
    rows = sharing_rows([{"sharing": sent}, {"sharing": got}, {}])
    assert [r["delay_s"] for r in rows] == [pytest.approx(0.0021), pytest.approx(0.0101)]
    assert rows[0]["first_s"] == pytest.approx(0.022)
    assert rows[1]["first_s"] == pytest.approx(0.018)
    assert all(r["second_s"] == pytest.approx(0.034) for r in rows)
    assert sharing_rows([{}, {}]) == []


def test_two_flow_rows_leave_out_rounds_that_did_not_share_an_empty_link() -> None:
    """A round that started before the previous round's bytes were through, or whose
    second flow started after the first flow's message had arrived, measured no two
    flows sharing an empty link: ``sharing_rows`` leaves it out of the medians, and a
    delay with no such round out of the rows."""
    from realrun.calibration.fits import sharing_rows

    plan = [0.01, 0.002, 0.01, 0.002, 0.01, 0.002, 0.01]
    first_start = [10.0 * k for k in range(len(plan))]
    firsts = [0.05, 0.020, 0.030, 0.022, 0.018, 0.024, 0.026]
    second_done = [t + 0.034 for t in first_start]
    second_start = [t + d + 1e-4 for t, d in zip(first_start, plan)]
    second_done[2] = first_start[3] + 0.001  # round 3 starts on round 2's last bytes
    second_start[4] = first_start[4] + 0.019  # round 4's second flow after its first's
    sent = {"delays_s": plan, "warmup": 1, "first_start_s": first_start,
            "second_start_s": second_start}  # fmt: skip
    got = {"delays_s": plan, "warmup": 1,
           "first_done_s": [t + f for t, f in zip(first_start, firsts)],
           "second_done_s": second_done}  # fmt: skip
    rows = sharing_rows([{"sharing": sent}, {"sharing": got}])
    # delay 0.002: rounds 1 and 5 (round 3 overlapped), delay 0.01: rounds 2 and 6
    assert rows[0]["first_s"] == pytest.approx((0.020 + 0.024) / 2)
    assert rows[1]["first_s"] == pytest.approx((0.030 + 0.026) / 2)
    # no round of a delay counts: no row for it
    sent["second_start_s"] = [t + 1.0 for t in first_start]
    assert sharing_rows([{"sharing": sent}, {"sharing": got}]) == []


@pytest.mark.parametrize("rate", [25e6, 125e6])
def test_the_chunk_keeps_a_calibrated_links_one_way_times(rate: float) -> None:
    """The simulated network's chunk for a calibrated link (``segment_bytes``: 64 KiB
    where tbf's bucket holds a segment, 16 KiB where it cuts segments into frames, as at
    200 Mbit/s) carries one message over the two shaped hops in the time the
    calibration's fit says it takes, ``latency + (n - burst) / goodput``, to within 0.15
    ms: the second hop adds no 64 KiB store-and-forward that the measured link does not
    have."""
    from simpy import Environment

    from realrun.calibration.fits import FRAME_CHUNK_BYTES, SEGMENT_BYTES, segment_bytes
    from simcore.network import DetailedNetwork
    from simcore.topology import TopologySpec, build_topology

    with open(NETNS_PRESET, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    latency, goodput = 50e-6, 0.95 * rate
    burst = burst_payload_bytes(rate)
    network = {
        **preset["network"],
        "bandwidth_bytes_per_s": f"{goodput}B/s",
        "latency_s": f"{latency / 2 * 1e6}us",  # per hop
        "burst_bytes": f"{int(burst)}B",
        "peak_bandwidth_bytes_per_s": f"{20 * rate}B/s",
    }
    preset = {**preset, "network": network}
    chunk = segment_bytes(preset)
    assert chunk == (FRAME_CHUNK_BYTES if rate < 50e6 else SEGMENT_BYTES)
    topo = build_topology(TopologySpec(preset, 2))
    for n in (256 << 10, 1 << 20, 4 << 20):
        env = Environment()
        net = DetailedNetwork(env, topo, chunk_bytes=chunk)
        msg = net.send(topo.gpus[0], topo.gpus[1], n)
        env.run()
        fitted = latency + max(0.0, n - burst) / goodput
        assert msg.end_s == pytest.approx(fitted, abs=0.15e-3)


def test_the_busy_cores_benchmark_is_fitted_on_the_unshaped_links_it_ran_on() -> None:
    """The wake-up wait is the machine's scheduler, measured on unshaped links: the fit
    simulates them (the calibration's unshaped latency over the two hops and goodput; no
    tbf bucket, peak or lead, so whole 64 KiB segments), whatever the shaped link of the
    preset."""
    from realrun.calibration.fits import SEGMENT_BYTES, segment_bytes
    from realrun.calibration.simfits import unshaped_links

    with open(NETNS_PRESET, encoding="utf-8") as fh:
        preset = yaml.safe_load(fh)
    shaped = {
        **preset,
        "network": {
            **preset["network"],
            "burst_bytes": "47820B",
            "peak_bandwidth_bytes_per_s": "2GB/s",
            "lead_s": "11ms",
            "bandwidth_bytes_per_s": "23.77MB/s",
        },
    }
    free = unshaped_links(shaped, 60e-6, 1.9e9)
    net = free["network"]
    assert not {"burst_bytes", "peak_bandwidth_bytes_per_s", "lead_s"} & set(net)
    assert parse_rate(net["bandwidth_bytes_per_s"]) == pytest.approx(1.9e9, rel=1e-3)
    assert parse_time(net["latency_s"]) == pytest.approx(30e-6, rel=1e-3)  # per hop
    assert net["sharing"] == shaped["network"]["sharing"] and free["host"] == shaped["host"]
    assert segment_bytes(free) == SEGMENT_BYTES == 4 * segment_bytes(shaped)
    assert shaped["network"]["burst_bytes"] == "47820B"  # the preset itself is left alone


def test_the_links_cpu_is_what_spinners_lost_beyond_the_ranks_per_byte_and_end() -> None:
    from realrun.linkcpu import link_cpu_s_per_byte

    row = {"lost_cores": 0.9, "ranks_cores": 0.3, "bytes": 100e6, "seconds": 2.0}
    # 0.6 cores beyond the ranks over 50 MB/s carried: 12 ns a byte, 6 at each end
    assert link_cpu_s_per_byte(row) == pytest.approx(6e-9)
    assert link_cpu_s_per_byte({**row, "lost_cores": 0.2}) == 0.0  # noise, not a gain
    assert link_cpu_s_per_byte({**row, "bytes": 0}) == 0.0


@pytest.mark.parametrize("failures, calls", [(0, 1), (1, 2), (2, 2)])
def test_measurements_that_cannot_be_fitted_are_taken_once_more(
    monkeypatch: pytest.MonkeyPatch, failures: int, calls: int
) -> None:
    """A busy machine can leave a benchmark without a trend to fit: ``calibrate``
    measures again once, and gives up (the fit's error) when the second cannot be
    fitted either."""
    import realrun.calibration.run as cal
    from realrun.calibration import CalibrationError

    measured: list[int] = []
    fitted: list[int] = []

    def fake_measure(*_args: Any) -> tuple:
        measured.append(1)
        return [], [], [], None, None

    def fake_preset(**kw: Any) -> dict:
        fitted.append(1)
        if len(fitted) <= failures:
            raise CalibrationError("the measurements cannot be fitted: no trend")
        return {"name": "fitted", "attempt": len(fitted)}

    monkeypatch.setattr(cal, "_measure", fake_measure)
    monkeypatch.setattr(cal, "make_preset", fake_preset)
    if failures == 2:
        with pytest.raises(CalibrationError, match="cannot be fitted"):
            cal.calibrate(cluster="local")
    else:
        assert cal.calibrate(cluster="local") == {"name": "fitted", "attempt": calls}
    assert len(measured) == len(fitted) == calls
