"""Real runs a careless or unlucky user cannot break: sizes refused before any rank starts,
bad numbers and names refused where they are parsed, outputs checked before the work and
failed writes that name the option and leave nothing half-written, hung ranks named within
the time limit, and what a killed run leaves removed by the next one (issue 44)."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dtsim.cli import main
from realrun import owner, stale
from realrun.guard import (
    RANK_BASE_BYTES,
    RANKS_PER_CORE,
    ModelFootprint,
    rank_bytes,
    rank_refusal,
    ranks_that_fit,
)
from simcore.guard import MEMORY_SHARE
from tests.helpers import netns_unavailable_reason

SIM = str(Path(sys.executable).parent / "sim")
GIB = 1 << 30


def run_main(capsys: Any, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


def one_line(code: int, err: str, expected: int = 2) -> str:
    assert code == expected, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---- the guard -------------------------------------------------------------------------


def test_ranks_that_fit_follow_memory_and_cores() -> None:
    per = rank_bytes(ModelFootprint(0, 0))
    assert per == RANK_BASE_BYTES
    # memory binds: 10 GiB free at MEMORY_SHARE, one rank costs `per`
    assert ranks_that_fit(per, 10 * GIB, 1000) == int(MEMORY_SHARE * 10 * GIB // per)
    # cores bind
    assert ranks_that_fit(per, 1 << 50, 3) == 3 * RANKS_PER_CORE
    # a bigger model fits fewer ranks
    big = rank_bytes(ModelFootprint(100 << 20, 50 << 20))
    assert big == RANK_BASE_BYTES + 4 * (100 << 20) + 2 * (50 << 20)
    assert ranks_that_fit(big, 10 * GIB, 1000) < ranks_that_fit(per, 10 * GIB, 1000)


def test_rank_refusal_says_how_many_fit() -> None:
    fp = ModelFootprint(1 << 20, 1 << 20)
    fit = ranks_that_fit(rank_bytes(fp), 8 * GIB, 2)
    assert rank_refusal(fit, fp, 8 * GIB, 2) is None
    why = rank_refusal(fit + 1, fp, 8 * GIB, 2)
    assert why is not None and f"at most {fit} ranks fit" in why
    assert "2 cores run at most 16 ranks" in rank_refusal(100, fp, 1 << 50, 2)
    assert "of memory" in rank_refusal(100, fp, GIB, 1000)


def test_model_footprint_counts_parameters_and_scales_activations() -> None:
    torch = pytest.importorskip("torch")
    from realrun import zoo
    from realrun.guard import model_footprint

    fp8 = model_footprint("cnn_small", None, 8)
    fp16 = model_footprint("cnn_small", None, 16)
    model = zoo.build("cnn_small")
    assert fp8.param_bytes == sum(p.numel() * p.element_size() for p in model.parameters())
    # activations are per sample: twice the batch, twice the bytes
    assert fp8.activation_bytes > 0 and fp16.activation_bytes == 2 * fp8.activation_bytes
    # at least the model's output is among them
    out = model(torch.zeros(8, *zoo.get("cnn_small").inputs[0].shape))
    assert fp8.activation_bytes >= out.numel() * out.element_size()


def test_absurd_ranks_are_refused_at_once(capsys: Any) -> None:
    t0 = time.monotonic()
    code, _o, err = run_main(
        capsys, "real", "--gpus", "100000", "--model", "mlp_small", "--iterations", "2"
    )
    line = one_line(code, err)
    assert "--gpus" in line and re.search(r"at most \d+ ranks? fit here", line), line
    assert time.monotonic() - t0 < 10  # nothing started; torch not even imported


# ---- numbers and names where they are parsed --------------------------------------------

REFUSED = [
    (["real", "--batch-size", "0", "--model", "mlp_small"], "--batch-size"),
    (["real", "--topology", "nosuchtopo", "--model", "mlp_small"], "--topology"),
    (["real", "--gpus", "0", "--model", "mlp_small"], "--gpus"),
    (["real", "--timeout-s", "0", "--model", "mlp_small"], "--timeout-s"),
    (["profile", "--model", "mlp_small", "--threads", "100000"], "--threads"),
    (["validate", "--dry-run", "--schemes", ""], "--schemes"),
    (["validate", "--dry-run", "--ranks", ""], "--ranks"),
    (["validate", "--dry-run", "--quick", "--calibration", "nosuchpreset"], "--calibration"),
    (["validate", "--dry-run", "--quick", "--out", "/proc/x"], "--out"),
    (["validate", "--dry-run", "--quick", "--batch-size", "0"], "--batch-size"),
    (["validate", "--dry-run", "--quick", "--repeats", "0"], "--repeats"),
    (["validate", "--dry-run", "--quick", "--sim-jitter", "-1"], "--sim-jitter"),
    (["real", "--model", "mlp_small", "--trace-out", "/proc/x.json"], "--trace-out"),
    (["real", "--model", "mlp_small", "--profile-out", "/proc/x.json"], "--profile-out"),
    (["real", "--model", "mlp_small", "--keep", "/proc/k"], "--keep"),
    (["calibrate", "--cluster", "local", "--out", "/proc/c.yaml"], "--out"),
    (["run", "--gpus", "2", "--trace-out", "/proc/x.json"], "--trace-out"),
]


@pytest.mark.parametrize("args, option", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_values_are_one_line_naming_the_option(args: list[str], option: str, capsys) -> None:
    line = one_line(*run_main(capsys, *args)[::2])
    assert option in line, line


# ---- outputs -----------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> Any:
    """A 2 MiB tmpfs (root only), to be filled by the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path, leave_bytes: int) -> None:
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    (folder / "fill").write_bytes(b"\0" * max(0, free - leave_bytes))


FULL = [
    (["run", "--gpus", "2", "--fidelity", "analytic", "--trace-out", "{d}/t.json"], "--trace-out"),
    (["sweep", "--gpus", "2,4", "--fidelity", "analytic", "--out", "{d}/s.csv"], "--out"),
    (["report", "--quick", "--out", "{d}/rep"], "--out"),
    (["trace", "convert", "resnet18-cpu", "{d}/x.json"], "OUT"),
    (["profile", "--model", "mlp_small", "--out", "{d}/p.json"], "--out"),
    (["calibrate", "--cluster", "local", "--out", "{d}/c.yaml"], "--out"),
    (["validate", "--quick", "--out", "{d}/v"], "--out"),
    (["real", "--gpus", "2", "--model", "mlp_small", "--keep", "{d}/keep"], "--keep"),
    (["train", "--epochs", "1", "--out", "{d}/tr"], "--out"),
    (["real", "--gpus", "2", "--model", "mlp_small", "--trace-out", "{d}/t.json"], "--trace-out"),
]


@pytest.mark.parametrize("args, option", FULL, ids=[" ".join(a[:2]) + " " + o for a, o in FULL])
def test_a_full_disk_is_refused_before_the_work(args, option, full_disk, capsys) -> None:
    fill(full_disk, 0)
    before = sorted(os.listdir(full_disk))
    argv = [a.replace("{d}", str(full_disk)) for a in args]
    line = one_line(*run_main(capsys, *argv)[::2])
    assert option in line and str(full_disk) in line and "free" in line, line
    assert sorted(os.listdir(full_disk)) == before  # no partial folder, no temporary file


def test_a_disk_that_fills_during_the_write_names_option_and_file(full_disk, capsys) -> None:
    fill(full_disk, 1280 << 10)  # passes the check, too small for the trace (about 4 MB)
    out = full_disk / "t.json"
    code, _o, err = run_main(
        capsys, "run", "--gpus", "16", "--iterations", "1", "--trace-out", str(out)
    )
    line = one_line(code, err)
    assert line.startswith(f"Error: --trace-out: {out}") and "No space" in line, line
    assert sorted(os.listdir(full_disk)) == ["fill"]


def test_a_failed_journal_write_leaves_no_torn_line(tmp_path: Path, monkeypatch) -> None:
    from analysis.store import SweepStore
    from traces.atomic import OutputPathError

    out = tmp_path / "s.csv"
    with SweepStore(out) as store:
        store.append({"point_id": "a", "status": "ok"})
        size = os.path.getsize(store.journal_path)
        real_write = os.write

        def half_then_full(fd: int, data: Any) -> int:
            if fd == store._fh.fileno():
                if len(data) > 4:
                    return real_write(fd, bytes(data[:4]))  # a short write, then ENOSPC
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", half_then_full)
        with pytest.raises(OutputPathError, match=r"s\.csv: cannot write its journal"):
            store.append({"point_id": "b", "status": "ok"})
        monkeypatch.undo()
        assert os.path.getsize(store.journal_path) == size
        lines = Path(store.journal_path).read_text().splitlines()
        assert [json.loads(x)["point_id"] for x in lines] == ["a"]


# ---- ownership and cleanup ---------------------------------------------------------------


def dead_tag() -> str:
    """The tag of a process that has come and gone."""
    p = subprocess.Popen(["sleep", "0.2"])
    tag = owner.owner_tag(p.pid)
    p.wait()
    assert not owner.tag_alive(tag)
    return tag


def test_remove_stale_takes_dead_owners_folders_and_ranks_only(tmp_path: Path) -> None:
    dead = dead_tag()
    mine = owner.owner_tag()
    gone = tmp_path / f"dtsim-real-{dead}-abc"
    live = tmp_path / f"dtsim-real-{mine}-abc"
    other = tmp_path / "dtsim-real-xyz"  # no owner: never touched
    for d in (gone, live, other):
        d.mkdir()
        (d / "heartbeat").write_bytes(b"x")
    orphan = subprocess.Popen(["sleep", "60"], env=dict(os.environ, DTSIM_RUN_OWNER=dead))
    kept = subprocess.Popen(["sleep", "60"], env=dict(os.environ, DTSIM_RUN_OWNER=mine))
    try:
        removed = stale.remove_stale(prefixes=("i44none",), tmp=str(tmp_path))
        assert removed.folders == [str(gone)]
        assert orphan.pid in removed.processes and kept.pid not in removed.processes
        assert orphan.wait(timeout=5) == -signal.SIGKILL
        assert kept.poll() is None
        assert live.exists() and other.exists() and not gone.exists()
        line = removed.describe()
        assert dead.split("-")[0] in line and "1 temporary folder" in line, line
    finally:
        kept.kill()
        kept.wait()


def test_a_rank_whose_owner_is_gone_stops_itself(tmp_path: Path) -> None:
    """The rank waits for its job (a FIFO nobody writes, so it blocks however fast it
    starts) when its owner dies: its watch stops it, exit 3."""
    holder = subprocess.Popen(["sleep", "3"])
    env = dict(os.environ, DTSIM_RUN_OWNER=owner.owner_tag(holder.pid))
    job = tmp_path / "job.fifo"
    os.mkfifo(job)
    rank = subprocess.Popen(
        [sys.executable, "-m", "realrun", "--job", str(job), "--out", "x"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    holder.wait()
    _o, err = rank.communicate(timeout=30)
    assert rank.returncode == 3, err
    assert f"owner (pid {holder.pid}) is gone" in err


def test_sim_clean_reports_what_it_removed(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("DTSIM_NETNS_PREFIX", f"dtc{secrets.token_hex(3)}")
    folder = tmp_path / f"dtsim-calibrate-{dead_tag()}-q1"
    folder.mkdir()
    code, out, _err = run_main(capsys, "clean", "-v")
    assert code == 0 and "1 temporary folder" in out and str(folder) in out
    assert not folder.exists()


@pytest.mark.parametrize(
    "args, patch, error",
    [
        (["real", "--gpus", "1", "--model", "mlp_small"], "dtsim.cli.real._execute", "rank"),
        (["calibrate", "--cluster", "local", "--out", "{d}/c.yaml"], "cal", "calib"),
        (["validate", "--quick", "--out", "{d}/v"], "realrun.netns.check_available", "netns"),
    ],
    ids=["real", "calibrate", "validate"],
)
def test_each_real_command_cleans_up_after_dead_runs_first(
    args, patch, error, tmp_path: Path, monkeypatch, capsys
) -> None:
    from realrun.calibration import CalibrationError
    from realrun.launch import RankFailed
    from realrun.netns import NetnsUnavailable

    def fail(*_a: Any, **_k: Any) -> Any:
        exc = {"rank": RankFailed(0, "stop here"), "calib": CalibrationError("stop here")}
        raise exc.get(error, NetnsUnavailable("stop here"))

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setenv("DTSIM_NETNS_PREFIX", f"dtc{secrets.token_hex(3)}")
    monkeypatch.setattr(patch if patch != "cal" else "realrun.calibration.run.calibrate", fail)
    dead = dead_tag()
    (tmp_path / f"dtsim-real-{dead}-x").mkdir()
    argv = [a.replace("{d}", str(tmp_path)) for a in args]
    code, _o, err = run_main(capsys, *argv)
    assert code in (1, 2) and "stop here" in err, err
    note = [x for x in err.splitlines() if x.startswith("note: removed")]
    assert len(note) == 1 and f"pid {dead.split('-')[0]}" in note[0], err
    assert not (tmp_path / f"dtsim-real-{dead}-x").exists()


# ---- hung and killed runs on the emulated cluster ----------------------------------------

_REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(
    _REASON is not None, reason=f"network namespaces unavailable: {_REASON}"
)


@pytest.fixture
def prefix() -> Any:
    from realrun import netns

    p = f"dti{secrets.token_hex(3)}"
    yield p
    left = netns.list_ours(p)
    if left:
        netns._delete_namespaces(left)
    assert not left, f"namespaces left behind: {left}"


def _owned_by(tag: str) -> list[int]:
    needle = f"{owner.OWNER_ENV}={tag}".encode()
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


@pytest.mark.real
@needs_netns
def test_a_stopped_rank_is_named_within_the_timeout(prefix: str) -> None:
    pytest.importorskip("torch")
    from realrun import netns

    timeout_s = 5
    env = dict(os.environ, DTSIM_NETNS_PREFIX=prefix, DTSIM_REAL_FAULT="stop:2:1")
    proc = subprocess.run(
        [
            SIM,
            "real",
            "--gpus",
            "3",
            "--model",
            "mlp_small",
            "--iterations",
            "3",
            "--cluster",
            "netns",
            "--timeout-s",
            str(timeout_s),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # (a run killed elsewhere on this machine meanwhile may add a line saying it was cleaned)
    err = "\n".join(x for x in proc.stderr.splitlines() if not x.startswith("note: removed"))
    line = one_line(proc.returncode, err, 1)
    assert "rank 2 (worker) hung" in line and "stopped" in line, line
    assert "in iteration 1" in line and "last span: " in line, line
    quiet = float(re.search(r"no rank made progress for (\d+) s", line).group(1))
    assert timeout_s <= quiet <= timeout_s + 3, line  # found at the limit, not a gloo timeout
    assert netns.list_ours(prefix) == []


@pytest.mark.real
def test_a_rank_stopped_before_meeting_the_others_is_named(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from realrun.job import Job
    from realrun.launch import RankFailed, launch

    job = Job(
        scheme="dp", model="mlp_small", workers=3, iterations=2, timeout_s=4.0, fault="stop:1:-1"
    )
    started: list[tuple[int, int]] = []
    with pytest.raises(RankFailed) as info:
        launch(job, str(tmp_path), on_start=lambda k, n: started.append((k, n)))
    assert started == [(1, 3), (2, 3), (3, 3)]  # progress from the first rank's start
    assert "rank 1 (worker) hung: it was stopped" in str(info.value)
    assert "starting up" in str(info.value)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", "a rank process outlived the run"


@pytest.mark.real
@needs_netns
def test_after_kill_9_the_next_run_starts_clean_and_says_so(prefix: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from realrun import netns

    # a temporary directory of this test's own: another run's cleanup cannot take its folder
    env = dict(os.environ, DTSIM_NETNS_PREFIX=prefix, TMPDIR=str(tmp_path))
    args = ["real", "--gpus", "2", "--model", "mlp_small", "--cluster", "netns"]
    victim = subprocess.Popen(
        [SIM, *args, "--iterations", "100000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tag = owner.owner_tag(victim.pid)
    deadline = time.monotonic() + 120
    while len(_owned_by(tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_owned_by(tag)) == 2, "the ranks never started"
    assert netns.list_ours(prefix)
    victim.kill()
    victim.wait()
    left = netns.list_ours(prefix)
    folders = [p for p in os.listdir(tmp_path) if p.startswith(f"dtsim-real-{tag}-")]
    assert left and folders  # what kill -9 leaves
    deadline = time.monotonic() + 10  # orphaned ranks stop themselves
    while _owned_by(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _owned_by(tag) == []
    nxt = subprocess.run(
        [SIM, *args[:2], "1", *args[3:], "--iterations", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert nxt.returncode == 0, nxt.stderr
    note = [x for x in nxt.stderr.splitlines() if x.startswith("note: removed")]
    assert len(note) == 1, nxt.stderr
    assert f"(pid {victim.pid})" in note[0] and f"{len(left)} network namespaces" in note[0]
    assert "1 temporary folder" in note[0]
    assert netns.list_ours(prefix) == []
    assert not [p for p in os.listdir(tmp_path) if p.startswith(f"dtsim-real-{tag}-")]
