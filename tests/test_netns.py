"""The emulated cluster (realrun.netns): namespaces on a bridge, tbf-shaped links, cleanup.

These tests build real network namespaces, so they need root, iproute2 and a kernel that
allows them; elsewhere they skip with the reason. Each test uses its own name prefix and
removes only namespaces carrying it, so tests never touch each other's (or anyone else's)
namespaces. The whole file takes a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from realrun import netns
from realrun.netns import (
    EmulatedCluster,
    Host,
    NetnsUnavailable,
    Terminated,
    check_available,
    list_ours,
    measure_goodput,
    measure_goodputs,
    remove_stale,
    shape_for_rate,
    terminate_as_interrupt,
)
from tests.helpers import netns_unavailable_reason

REPO = Path(__file__).resolve().parent.parent
MBIT = 1e6 / 8  # bytes/s in one Mbit/s


_REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    _REASON is not None, reason=f"network namespaces unavailable: {_REASON}"
)


@pytest.fixture
def prefix() -> Iterator[str]:
    """A prefix of this test's own; whatever carries it is removed afterwards (only that)."""
    p = f"dtt{secrets.token_hex(3)}"
    yield p
    left = list_ours(p)
    if left:
        netns._delete_namespaces(left)


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def _ns_out(cluster: EmulatedCluster, index: int, argv: list[str]) -> str:
    return subprocess.run(
        cluster.command(index, argv), capture_output=True, text=True, check=True, timeout=20
    ).stdout


_ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(8)
print(s.getsockname()[1], flush=True)
for _ in range(int(sys.argv[2])):
    c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
"""
_ECHO_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.sendall(sys.argv[3].encode()); print(s.recv(64).decode())
"""


def _ping_all(cluster: EmulatedCluster) -> None:
    """Every host reaches every other over TCP: an echo server per host, a client per peer."""
    n = len(cluster.hosts)
    for dst in cluster.hosts:
        server = subprocess.Popen(
            cluster.command(
                dst.index, [sys.executable, "-c", _ECHO_SERVER, dst.address, str(n - 1)]
            ),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            port = server.stdout.readline().strip()
            for src in cluster.hosts:
                if src.index == dst.index:
                    continue
                word = f"ping{src.index}to{dst.index}"
                reply = _ns_out(
                    cluster,
                    src.index,
                    [sys.executable, "-c", _ECHO_CLIENT, dst.address, port, word],
                )
                assert reply.strip() == word
            assert server.wait(timeout=10) == 0
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


# ---------------------------------------------------------------------------------------
# Without namespaces (run anywhere)


def test_unavailable_message_says_why_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetnsUnavailable) as err:
        check_available()
    msg = str(err.value)
    assert "root" in msg and "--cluster local" in msg and "\n" not in msg
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    with pytest.raises(NetnsUnavailable, match=r"`tc`.*--cluster local"):
        check_available()


def test_shape_settings_are_sensible() -> None:
    for rate in (1 * MBIT, 50 * MBIT, 200 * MBIT, 10_000 * MBIT):
        s = shape_for_rate(rate)
        assert s.rate_bytes_per_s == rate
        assert s.burst_bytes >= netns.FRAME_BYTES  # a full frame always fits
        assert s.burst_bytes >= rate * 0.002  # the bucket outlasts timer slack
        assert s.limit_bytes > s.burst_bytes
        # the queue holds at most ~50 ms (or 64 KiB on slow links), never seconds
        assert s.limit_bytes - s.burst_bytes <= max(rate * 0.05, 64 * 1024) + 1
    with pytest.raises(ValueError):
        shape_for_rate(0)
    with pytest.raises(FrozenInstanceError):
        Host(0, "ns", "if", "10.0.0.1").index = 1  # type: ignore[misc]


def test_terminate_as_interrupt_raises_and_restores() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as err, terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs before this returns
    assert err.value.signum == signal.SIGTERM
    assert isinstance(err.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) == before


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="hosts"):
        EmulatedCluster(0, None, prefix="dttbad")
    with pytest.raises(ValueError, match="prefix"):
        EmulatedCluster(2, None, prefix="has-dash")
    assert list_ours("dttbad") == []


# ---------------------------------------------------------------------------------------
# With namespaces


@needs_netns
def test_three_hosts_reach_each_other_and_close_leaves_nothing(prefix: str) -> None:
    links_before = _root_links()
    rate = 100 * MBIT
    with EmulatedCluster(3, rate, prefix=prefix) as cluster:
        hosts = cluster.hosts
        assert [h.index for h in hosts] == [0, 1, 2]
        assert len(list_ours(prefix)) == 4  # three hosts and the switch
        assert sorted(cluster.namespaces()) == list_ours(prefix)
        assert cluster.link_rates() == [rate] * 3 and cluster.rate_bytes_per_s == rate
        # nothing of ours in the root namespace, even while the cluster exists
        assert _root_links() == links_before
        subnets = {h.address.rsplit(".", 1)[0] for h in hosts}
        assert len(subnets) == 1 and subnets.pop().startswith("10.")
        assert len({h.address for h in hosts}) == 3
        for h in hosts:
            assert h.namespace.startswith(f"{prefix}-{os.getpid()}-")
            assert len(h.ifname) <= 15
            addr = subprocess.run(
                ["ip", "-n", h.namespace, "-o", "-4", "addr", "show"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert f"{h.address}/24" in addr and h.ifname in addr
            assert "127.0.0.1" in addr  # lo is up
            qdisc = subprocess.run(
                ["tc", "-n", h.namespace, "qdisc", "show", "dev", h.ifname],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "tbf" in qdisc and "rate 100Mbit" in qdisc
            # the environment is inherited through command()
            env = subprocess.run(
                cluster.command(h.index, ["sh", "-c", "echo $NETNS_T"]),
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "NETNS_T": "kept"},
            ).stdout
            assert env.strip() == "kept"
        switch_qdiscs = subprocess.run(
            ["tc", "-n", cluster.switch_namespace, "qdisc", "show"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert switch_qdiscs.count("qdisc tbf") == 3  # the switch -> host direction
        _ping_all(cluster)
        # a process left running inside is stopped by close()
        straggler = subprocess.Popen(cluster.command(1, ["sleep", "60"]))
    assert cluster.closed
    assert straggler.wait(timeout=5) != 0
    cluster.close()  # idempotent
    assert list_ours(prefix) == []
    assert _root_links() == links_before
    with pytest.raises(RuntimeError, match="closed"):
        cluster.command(0, ["true"])


@needs_netns
def test_shaped_goodput_is_near_the_rate_and_unshaped_is_faster(prefix: str) -> None:
    rate = 50 * MBIT
    nbytes = 8_000_000  # ~1.3 s at 50 Mbit/s
    with EmulatedCluster(2, rate, prefix=prefix) as cluster:
        goodput = measure_goodput(cluster, 0, 1, nbytes)
        stats = cluster.qdisc_stats()
    # TCP framing: ~1448/1514 of the rate; tbf's first burst may add a little
    assert 0.80 * rate <= goodput <= 1.02 * rate, goodput / rate
    # both ends shaped the transfer: the sender's uplink and the receiver's downlink
    assert stats[0]["up"]["bytes"] >= nbytes and stats[1]["down"]["bytes"] >= nbytes
    with EmulatedCluster(2, None, prefix=prefix) as cluster:
        assert cluster.link_rates() == [None, None]
        unshaped = measure_goodput(cluster, 1, 0, nbytes)
    assert unshaped > 4 * rate, unshaped / rate


@needs_netns
def test_shaping_applies_to_each_direction(prefix: str) -> None:
    """The receiver's downlink is shaped too: two hosts sending into a third at once (each
    uplink free to reach the rate) share the third host's downlink."""
    rate = 40 * MBIT
    nbytes = 3_000_000
    with EmulatedCluster(3, rate, prefix=prefix) as cluster:
        results = dict(zip((0, 1), measure_goodputs(cluster, [(0, 2), (1, 2)], nbytes)))
        # the two directions of a link are shaped apart: flows both ways add up
        both_ways = measure_goodputs(cluster, [(0, 1), (1, 0)], nbytes)
        stats = cluster.qdisc_stats()
    assert sorted(results) == [0, 1]
    assert sum(both_ways) > 1.4 * rate and max(both_ways) <= 1.02 * rate, both_ways
    # unshaped downlinks would let the two flows add up to twice the rate
    assert sum(results.values()) <= 1.3 * rate, sum(results.values()) / rate
    assert stats[2]["down"]["bytes"] >= 2 * nbytes
    assert stats[0]["up"]["bytes"] >= nbytes and stats[1]["up"]["bytes"] >= nbytes


@needs_netns
def test_interface_counters_grow_by_the_payload(prefix: str) -> None:
    nbytes = 3_000_000
    with EmulatedCluster(3, None, prefix=prefix) as cluster:
        before = cluster.interface_bytes()
        measure_goodput(cluster, 2, 0, nbytes)
        after = cluster.interface_bytes()
    assert [c["ifname"] for c in after] == [h.ifname for h in cluster.hosts]
    delta = [
        {k: after[i][k] - before[i][k] for k in ("tx_bytes", "rx_bytes", "tx_packets")}
        for i in range(3)
    ]
    assert delta[2]["tx_bytes"] >= nbytes and delta[0]["rx_bytes"] >= nbytes
    assert delta[2]["tx_packets"] > 0
    # framing overhead is small: not more than ~10 % on full segments
    assert delta[2]["tx_bytes"] < 1.1 * nbytes
    assert delta[1]["tx_bytes"] < 10_000  # the idle host sent (almost) nothing


@needs_netns
def test_exception_inside_with_cleans_up(prefix: str) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ZeroDivisionError), EmulatedCluster(2, 10 * MBIT, prefix=prefix):
        assert len(list_ours(prefix)) == 3
        _ = 1 / 0
    assert list_ours(prefix) == []
    # the SIGTERM handler installed while the cluster was open is gone again
    assert signal.getsignal(signal.SIGTERM) == handler


def _default_signals() -> None:
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


def _holder(prefix: str) -> subprocess.Popen[str]:
    """A process that builds a 2-host shaped cluster and holds it; returns once it is up."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "realrun.netns",
            "--hosts",
            "2",
            "--rate",
            "100Mbps",
            "--prefix",
            prefix,
            "--hold",
            "60",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a suite started in the background (nohup, `&`) passes its
        # ignored SIGHUP/SIGINT on, and a holder that ignores them cannot be tested
        preexec_fn=_default_signals,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    for line in proc.stdout:
        if line.strip() == "ready" or time.monotonic() > deadline:
            break
    if proc.poll() is not None:
        pytest.fail(f"holder exited early: {proc.stderr.read() if proc.stderr else ''}")
    assert len(list_ours(prefix)) == 3
    return proc


@needs_netns
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_signal_to_holder_cleans_up(prefix: str, sig: signal.Signals) -> None:
    proc = _holder(prefix)
    try:
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
        assert time.monotonic() - t0 < 5  # promptly
        assert rc == 128 + sig
        assert list_ours(prefix) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_netns
def test_remove_stale_after_sigkill_spares_live_clusters(prefix: str) -> None:
    proc = _holder(prefix)
    left = list_ours(prefix)
    proc.kill()
    proc.wait(timeout=10)
    assert list_ours(prefix) == left  # SIGKILL cannot be cleaned up after...
    with EmulatedCluster(2, None, prefix=prefix) as live:
        removed = remove_stale(prefix)  # ...but the next run removes it
        assert sorted(removed) == left
        assert list_ours(prefix) == sorted(live.namespaces())  # ours is alive: kept
        assert remove_stale(prefix) == []
    assert list_ours(prefix) == []


@needs_netns
def test_list_ours_matches_only_its_prefix(prefix: str) -> None:
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(EmulatedCluster(1, None, prefix=prefix))
        b = stack.enter_context(EmulatedCluster(1, None, prefix=prefix + "x"))
        assert list_ours(prefix) == sorted(a.namespaces())
        assert list_ours(prefix + "x") == sorted(b.namespaces())
        assert a.subnet != b.subnet
    assert list_ours(prefix) == [] and list_ours(prefix + "x") == []


@needs_netns
def test_close_finishes_even_if_interrupted(prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt that gets into close() (a signal handled while another thread held the
    signal) does not leave namespaces behind: deletion is retried, then it is re-raised."""
    real = netns._delete_namespaces
    calls = []

    def interrupted_once(names: list[str]) -> list[str]:
        calls.append(list(names))
        if len(calls) == 1:
            real(names[:1])
            raise KeyboardInterrupt
        return real(names)

    cluster = EmulatedCluster(3, 10 * MBIT, prefix=prefix)
    monkeypatch.setattr(netns, "_delete_namespaces", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        cluster.close()
    assert len(calls) == 2 and len(calls[1]) == 3  # the second pass removed the rest
    assert list_ours(prefix) == []
