"""Real runs on the emulated cluster (network namespaces, links shaped with tc): P3's
priority on a congested link, the command end to end, and cleanup on SIGTERM. Needs root
(CI runs as root here); skips with the reason elsewhere."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import netns_unavailable_reason

pytest.importorskip("torch", reason="real runs need torch (make test installs it)")

from realrun import netns
from realrun.job import Job
from realrun.launch import Placement, launch
from realrun.netns import EmulatedCluster, list_ours

pytestmark = pytest.mark.real

SIM = str(Path(sys.executable).parent / "sim")
MBIT = 1e6 / 8


_REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    _REASON is not None, reason=f"network namespaces unavailable: {_REASON}"
)


@pytest.fixture
def prefix() -> Any:
    """A prefix of this test's own; whatever still carries it afterwards is removed (and
    the test fails, since nothing should be left)."""
    p = f"dtr{secrets.token_hex(3)}"
    yield p
    left = list_ours(p)
    if left:
        netns._delete_namespaces(left)
    assert not left, f"namespaces left behind: {left}"


def _completion_order(records: dict[str, Any], worker: int) -> list[list[int]]:
    """Per measured iteration, the layers of one worker in the order their last value
    arrived."""
    warm = records["job"]["warmup_iterations"]
    rank = next(r for r in records["ranks"] if r["rank"] == worker)
    last: dict[int, dict[int, float]] = {}
    for s in rank["spans"]:
        if s[1] == "recv" and s[3].startswith("pull L") and s[6] >= warm:
            per = last.setdefault(s[6], {})
            per[s[7]] = max(per.get(s[7], 0.0), s[5])
    return [sorted(per, key=per.get) for _it, per in sorted(last.items())]


@needs_netns
def test_p3_first_layer_overtakes_on_a_congested_link(prefix: str, tmp_path: Path) -> None:
    """At 20 Mbit/s a backward's slices queue up: P3 sends the first layer's ahead of the
    big middle layer's (after the one slice already on the wire); MXNet's FIFO sends it
    last."""
    first, middle = 1, 3  # mlp_small: body.0 (66 KB), body.2 (263 KB), head (10 KB)
    orders = {}
    for scheme, options in (("p3", {"slice_params": 2000}), ("ps", {})):
        job = Job(
            scheme=scheme,
            model="mlp_small",
            workers=2,
            servers=1,
            iterations=2,
            options=options,
            timeout_s=60,
        )
        with EmulatedCluster(job.hosts, 20 * MBIT, prefix=prefix) as emu:
            placement = Placement(
                emu.command, emu.hosts[0].address, lambda h, emu=emu: emu.hosts[h].ifname
            )
            records = launch(job, str(tmp_path / scheme), placement)
        orders[scheme] = _completion_order(records, 1)  # the worker not beside the server
    assert orders["p3"] and all(o.index(first) < o.index(middle) for o in orders["p3"]), orders
    assert orders["ps"] and all(o[-1] == first for o in orders["ps"]), orders


@needs_netns
def test_sim_real_netns_end_to_end(prefix: str) -> None:
    env = dict(os.environ, DTSIM_NETNS_PREFIX=prefix)
    out = subprocess.run(
        [
            SIM,
            "real",
            "--gpus",
            "3",
            "--scheme",
            "p3",
            "--model",
            "mlp_small",
            "--cluster",
            "netns",
            "--bandwidth",
            "200Mbps",
            "--iterations",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["cluster"] == "netns" and r["link_rate_bytes_per_s"] == pytest.approx(25e6)
    # what the hosts' veths carried covers what the ranks sent between hosts
    between_hosts = r["comm_bytes_by_link_kind"]["ethernet"] / 2
    assert r["wire_bytes_total"] >= between_hosts
    assert list_ours(prefix) == []


@needs_netns
def test_sigterm_mid_run_leaves_nothing(prefix: str, tmp_path: Path) -> None:
    env = dict(os.environ, DTSIM_NETNS_PREFIX=prefix)
    proc = subprocess.Popen(
        [
            SIM,
            "real",
            "--gpus",
            "2",
            "--scheme",
            "dp",
            "--model",
            "mlp_small",
            "--cluster",
            "netns",
            "--bandwidth",
            "100Mbps",
            "--iterations",
            "100000",
            "--keep",
            str(tmp_path / "run"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list_ours(prefix) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list_ours(prefix), "the cluster never came up"
    time.sleep(6)  # the ranks are running
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert list_ours(prefix) == []
    assert "Traceback" not in err
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", "rank processes outlived sim real"


@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0,
    reason="needs root and setpriv to run as an unprivileged user",
)
def test_netns_without_root_says_so_in_one_line() -> None:
    out = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            SIM,
            "real",
            "--gpus",
            "2",
            "--model",
            "mlp_small",
            "--cluster",
            "netns",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME="/tmp"),
    )
    assert out.returncode == 2, out.stderr
    assert "root" in out.stderr and "--cluster local" in out.stderr
    assert out.stderr.strip().count("\n") == 0
