"""Convergence under staleness: the staleness emulator (realrun/emulate.py) against the
multi-process pipeline runtime on real data, the weight-version gaps the schedules
prescribe, SpecTrain's prediction at distance 0, the shared data order, and ``sim train``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="real runs need torch (make test installs it)")
pytest.importorskip("sklearn", reason="the digits data ship with scikit-learn")

from analysis.convergence import training_job  # noqa: E402
from realrun import data  # noqa: E402
from realrun.emulate import emulate  # noqa: E402
from realrun.job import Job  # noqa: E402
from realrun.pipeline import make_schedule, microbatch, prescribed_versions  # noqa: E402
from realrun.runtime import build_model  # noqa: E402
from simcore import schedule as sch  # noqa: E402


def _job(scheme: str, gpus: int = 3, batch: int = 96, epochs: int = 1, **kw: Any) -> Job:
    kw.setdefault("lr", 0.02)
    return training_job("digits_mlp", scheme, gpus=gpus, epochs=epochs, batch=batch, **kw)


def _assert_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-5, msg=k)


# ---- the emulator equals the distributed run ------------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("scheme", ["pipedream", "vanilla", "spectrain"])
def test_emulator_equals_the_multi_process_run_after_an_epoch(tmp_path: Path, scheme: str) -> None:
    from realrun.launch import launch

    job = _job(scheme, batch=192)  # 7 updates make the epoch
    job = dataclasses.replace(job, save_weights=True, timeout_s=60.0, record_layers=False)
    records = launch(job, str(tmp_path))
    real: dict[str, Any] = {}
    for r in records["ranks"]:
        epochs = torch.load(tmp_path / f"epoch-weights-rank{r['rank']}.pt")
        real.update(epochs[1])
    em = emulate(job, epochs=1, keep_weights=True)
    _assert_weights(real, em.epoch_weights[1])
    init = dict(build_model(job, torch.device("cpu")).model.named_parameters())
    assert all(not torch.equal(real[k], init[k]) for k in real)
    # every pass ran on the version the schedule prescribes, in both
    p = job.pipeline
    sched = make_schedule(
        job.scheme, job.options, p["replicas"], p["microbatches"], job.total_iterations + p["tail"]
    )
    u = data.updates_per_epoch(job)
    for r in records["ranks"]:
        want = prescribed_versions(sched, r["rank"])
        assert [tuple(x) for x in r["passes"]] == want
        got = sorted(tuple(x) for x in em.passes[r["stage"]])
        assert got == sorted(w for w in want if w[0] < u)


# ---- staleness as the schedules prescribe it -------------------------------------------------


@pytest.mark.parametrize("gpus", [3, 4])
def test_pipedream_stage_k_sees_a_gap_of_n_minus_k_minus_1(gpus: int) -> None:
    job = _job("pipedream", gpus=gpus, batch=64)
    em = emulate(job, epochs=1)
    assert len(em.gaps) == gpus
    for k, gaps in enumerate(em.gaps):
        # the first micro-batches fill the pipeline; from then on the gap is constant
        assert gaps[:gpus] == [min(i, gpus - k - 1) for i in range(gpus)], k
        assert set(gaps[gpus:]) == {gpus - k - 1}, k


def test_emulator_passes_use_the_schedules_versions() -> None:
    for scheme in ("vanilla", "spectrain"):
        job = _job(scheme, gpus=4, batch=64)
        em = emulate(job, epochs=1)
        p = job.pipeline
        sched = make_schedule(
            job.scheme, job.options, p["replicas"], p["microbatches"], job.total_iterations
        )
        u = data.updates_per_epoch(job)
        for k in range(4):
            want = sorted(w for w in prescribed_versions(sched, k) if w[0] < u)
            assert sorted(tuple(x) for x in em.passes[k]) == want
            backward_gap = [
                b[2] - f[2]
                for f, b in zip(
                    (x for x in em.passes[k] if x[1] == sch.FORWARD),
                    (x for x in em.passes[k] if x[1] == sch.BACKWARD),
                )
            ]
            if scheme == "vanilla":  # the backward runs on weights N-k-1 updates newer
                assert set(backward_gap[4:]) == {4 - k - 1}
            else:  # once the pipeline is full, both passes predict the same version
                assert set(backward_gap[4:]) == {0}


def test_spectrain_with_prediction_distance_zero_is_vanilla_pipelining() -> None:
    vanilla = _job("vanilla", gpus=3, batch=96)
    d = vanilla.to_dict()
    d["scheme"] = "spectrain"
    d["options"] = {"microbatches": vanilla.pipeline["microbatches"]}
    spectrain = Job.from_dict(d)
    a = emulate(vanilla, epochs=1, keep_weights=True)
    b = emulate(spectrain, epochs=1, keep_weights=True, spectrain_distance=lambda *_: 0)
    for k in a.epoch_weights[1]:
        torch.testing.assert_close(a.epoch_weights[1][k], b.epoch_weights[1][k], rtol=0, atol=0)
    assert a.epochs == b.epochs
    c = emulate(spectrain, epochs=1, keep_weights=True)  # real prediction: different
    assert any(
        not torch.equal(a.epoch_weights[1][k], c.epoch_weights[1][k]) for k in a.epoch_weights[1]
    )


# ---- the same data for every scheme ----------------------------------------------------------


def test_every_scheme_sees_the_same_update_batches_in_the_same_order() -> None:
    b = 32
    split = data.load("digits", 0)
    jobs = {s: _job(s, gpus=4, batch=b) for s in ("dp", "gossip", "gpipe", "pipedream")}
    u = data.updates_per_epoch(jobs["dp"])
    assert all(data.updates_per_epoch(j) == u for j in jobs.values())
    assert u == len(split.train_y) // b
    seen = []
    for i in range(u + 3):
        ref = data.update_indices("digits", 0, b, i)
        want = split.train_y[ref]
        dp = torch.cat([data.batch(jobs["dp"], r, i)[1] for r in range(4)])
        gpipe = data.batch(jobs["gpipe"], 0, i)[1]
        pd = jobs["pipedream"]
        m = pd.pipeline["microbatches"]
        piped = microbatch(pd, i, m, {})[1]
        assert torch.equal(dp, want) and torch.equal(gpipe, want) and torch.equal(piped, want)
        x = torch.cat([data.batch(jobs["gossip"], r, i)[0][0] for r in range(4)])
        torch.testing.assert_close(x, split.train_x[ref], rtol=0, atol=0)
        if i < u:
            seen.append(ref)
    first = torch.cat(seen)
    assert sorted(first.tolist()) == sorted(set(first.tolist()))  # no sample twice an epoch
    assert not torch.equal(
        data.update_indices("digits", 0, b, 0), data.update_indices("digits", 0, b, u)
    )


def test_the_schemes_merged_as_one_are_those_the_emulator_trains_alike() -> None:
    """``SAME_NUMERICS`` (their classes' ``same_numerics``) are the study's synchronous
    schemes, and the emulator gives each of them dp's curves; a stale pipeline's differ."""
    from analysis.convergence import SAME_NUMERICS

    assert SAME_NUMERICS == ("dp", "ps", "p3", "mp", "gpipe")
    curves = {s: emulate(_job(s, gpus=2, batch=64), 1).epochs for s in (*SAME_NUMERICS, "vanilla")}
    assert all(curves[s] == curves["dp"] for s in SAME_NUMERICS)
    assert curves["vanilla"] != curves["dp"]


def test_split_is_standardised_and_disjoint() -> None:
    s = data.load("digits", 3)
    assert len(s.train_y) + len(s.val_y) == 1797
    assert abs(float(s.train_x.mean())) < 1e-4
    assert set(s.train_y.tolist()) == set(range(10))
    with pytest.raises(ValueError, match="digits"):
        data.load("mnist", 0)


# ---- sim train ------------------------------------------------------------------------------


def _main(capsys: Any, *args: str) -> tuple[int, str, str]:
    from dtsim.cli import main

    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return int(ex.value.code or 0), out, err


@pytest.mark.parametrize(
    "args, names",
    [
        (["--scheme", "pipedreem"], "--scheme: 'pipedreem' is not allowed"),
        (["--model", "resnet50"], "--model: 'resnet50' is not allowed"),
        (["--model", "nope"], "--model: 'nope' is not allowed"),
        (["--lr", "fast"], "--lr: 'fast' is not allowed"),
        (["--lr", "digits_rnn=0.1"], "--lr: 'digits_rnn=0.1' is not allowed"),
        (["--seed", "x"], "--seed: 'x' is not allowed"),
        (["--epochs", "0"], "--epochs: 0 is not allowed"),
        (["--batch", "30", "--scheme", "dp"], "batch: 30 is not allowed with 4"),
        (["--batch", "5000"], "batch: 5000 is not allowed"),
        (["--scheme", "gossip", "--gpus", "3"], "gpus: 3 is not allowed"),
        (["--target-accuracy", "120"], "--target-accuracy: 120"),
        (["--momentum", "1.5"], "--momentum: 1.5 is not allowed"),
        (["--topology", "moon"], "--topology: 'moon' is not allowed"),
    ],
)
def test_train_bad_input_is_one_line(
    capsys: Any, tmp_path: Path, args: list[str], names: str
) -> None:
    out_dir = tmp_path / "out"
    code, _out, err = (
        _main(
            capsys, "train", "--model", "digits_mlp", *args, "--epochs", "1", "--out", str(out_dir)
        )
        if "--epochs" not in args
        else _main(capsys, "train", *args, "--out", str(out_dir))
    )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and names in lines[0], err
    assert "Traceback" not in err
    assert not out_dir.exists()  # nothing made before the input is checked


def test_train_writes_curves_table_and_figures(capsys: Any, tmp_path: Path) -> None:
    code, out, err = _main(
        capsys,
        "train",
        "--model",
        "digits_mlp",
        "--scheme",
        "dp,ps,gossip,gossip-gradients,pipedream,vanilla,spectrain",
        "--epochs",
        "2",
        "--batch",
        "64",
        "--seed",
        "0,1",
        "--target-accuracy",
        "80",
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    assert "| digits_mlp | spectrain |" in out and "max val accuracy" in out
    assert "reaches 80% with" in out
    import pandas as pd

    curves = pd.read_parquet(tmp_path / "curves.parquet")
    assert len(curves) == 7 * 2 * 2
    # the gossip workers' disagreement, and only theirs; averaging the weights keeps the
    # workers together, averaging gradients alone lets them drift apart
    gossip = curves["scheme"].str.startswith("gossip")
    assert curves.loc[gossip, "disagreement"].gt(0).all()
    assert curves.loc[~gossip, "disagreement"].isna().all()
    last = curves[curves["epoch"] == 2].groupby("scheme")["disagreement"].mean()
    assert last["gossip"] < last["gossip-gradients"] / 10
    assert "disagreement" in out and (tmp_path / "disagreement.png").stat().st_size > 10_000
    assert curves["val_accuracy"].between(0, 1).all()
    dp = curves[curves["scheme"] == "dp"].reset_index(drop=True)
    ps = curves[curves["scheme"] == "ps"].reset_index(drop=True)
    assert dp.drop(columns="scheme").equals(ps.drop(columns="scheme"))  # same numerics
    table = pd.read_csv(tmp_path / "table.csv")
    assert set(table["seeds"]) == {2}
    assert (tmp_path / "table.md").read_text().startswith("| model |")
    assert (tmp_path / "convergence-digits_mlp.png").stat().st_size > 10_000
    tta = pd.read_csv(tmp_path / "time_to_accuracy.csv")
    assert (tta["seconds_per_update"] > 0).all()
    done = tta.dropna(subset=["time_to_target_s"])
    assert (
        len(done)
        and (
            done["time_to_target_s"] == done["updates_to_target"] * done["seconds_per_update"]
        ).all()
    )


@pytest.mark.real
def test_gossip_emulator_equals_the_multi_process_run(tmp_path: Path) -> None:
    """Pairwise averaging with the sample shuffle, over two epochs: the emulator's curves
    are the real run's (worker 0's weights evaluated after each epoch)."""
    from analysis.convergence import real_curves

    job = _job("gossip", gpus=4, batch=192, epochs=2)
    real = real_curves(job, 2, str(tmp_path))
    em = emulate(job, 2).epochs
    assert [r["epoch"] for r in real] == [1, 2]
    for a, b in zip(real, em):
        for key in ("val_loss", "val_accuracy", "train_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key


def test_table_target_and_ordering_from_known_curves() -> None:
    import pandas as pd

    from analysis.convergence import ordering, paper_table, to_target

    rows = []
    # accuracy per epoch for two seeds; dp best, spectrain next, the stale ones behind
    acc = {
        "dp": [(0.80, 0.96), (0.82, 0.98)],
        "spectrain": [(0.79, 0.95), (0.81, 0.97)],
        "pipedream": [(0.70, 0.90), (0.72, 0.92)],
        "vanilla": [(0.60, 0.85), (0.62, 0.89)],
    }
    for scheme, seeds in acc.items():
        for seed, (a1, a2) in enumerate(seeds):
            for epoch, a in ((1, a1), (2, a2)):
                rows.append(
                    {
                        "model": "m",
                        "scheme": scheme,
                        "seed": seed,
                        "epoch": epoch,
                        "updates": 10 * epoch,
                        "samples": 320 * epoch,
                        "train_loss": 1.0 / epoch + seed,
                        "val_loss": 2.0 / epoch,
                        "val_accuracy": a,
                    }
                )
    curves = pd.DataFrame(rows)
    table = paper_table(curves).set_index("scheme")
    assert table.loc["dp", "max_val_accuracy_mean"] == pytest.approx((0.96 + 0.98) / 2)
    assert table.loc["dp", "max_val_accuracy_std"] == pytest.approx(0.01 * 2**0.5)  # n - 1
    assert table.loc["dp", "min_train_loss_mean"] == pytest.approx((0.5 + 1.5) / 2)
    assert (table["seeds"] == 2).all()
    hits = to_target(curves, 0.95).set_index(["scheme", "seed"])
    assert hits.loc[("dp", 0), "epoch"] == 2 and hits.loc[("dp", 0), "samples"] == 640
    assert pd.isna(hits.loc[("vanilla", 1), "updates"])
    (line,) = ordering(paper_table(curves))
    assert "spectrain -1.00" in line and "pipedream -6.00" in line and "holds" in line
    worse = curves.copy()
    worse.loc[worse["scheme"] == "spectrain", "val_accuracy"] -= 0.2
    assert "does not hold" in ordering(paper_table(worse))[0]


def test_report_section_has_the_table_figures_and_time_to_accuracy(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from analysis.convergence import report_section

    for sub in ("data", "figures"):
        (tmp_path / sub).mkdir()
    md = report_section(str(tmp_path), quick=True)
    assert md.startswith("## Convergence under staleness and time to accuracy")
    assert "| digits_mlp | spectrain |" in md and "time to accuracy |" in md
    assert "reaches 90% with" in md and "the paper's ordering" in md
    assert (tmp_path / "figures" / "convergence-digits_mlp.png").exists()
    data_file = tmp_path / "data" / "convergence-curves.csv"
    before = data_file.stat().st_mtime_ns
    assert report_section(str(tmp_path), quick=True) == md  # reused, not retrained
    assert data_file.stat().st_mtime_ns == before


def test_disagreement_is_the_mean_distance_from_the_average() -> None:
    """Two workers a and b: each is |a - b| / 2 from their average; a third equal to the
    average adds a zero. Over all parameters as one vector."""
    from realrun.emulate import disagreement

    a = {"w": torch.tensor([0.0, 0.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}
    assert disagreement([a, b]) == pytest.approx(2.5)
    mid = {k: (a[k] + b[k]) / 2 for k in a}
    assert disagreement([a, b, mid]) == pytest.approx(5 / 3)
    assert disagreement([a, a]) == 0


@pytest.mark.parametrize("exchange", ["weights", "gradients", "gradients+weights"])
def test_gossip_workers_without_updates_stay_one_model(exchange: str) -> None:
    """All workers start from the same weights; with a learning rate of zero nothing moves
    them apart, whatever is exchanged: the disagreement stays exactly zero, and every
    epoch's evaluation is the initial model's."""
    job = _job("gossip", gpus=4, batch=192, epochs=2)
    job = dataclasses.replace(job, lr=0.0, options={**job.options, "exchange": exchange})
    rows = emulate(job, 2).epochs
    assert [r["disagreement"] for r in rows] == [0.0, 0.0]
    assert rows[0]["val_loss"] == rows[1]["val_loss"]


@pytest.mark.parametrize(
    "exchange, schedule, rotation, shuffle",
    [
        ("weights", "hypercube", "singer", True),
        ("gradients", "dissemination", "random", True),
        ("gradients+weights", "hypercube", "shift", False),
    ],
)
def test_gossip_emulator_equals_the_written_out_reference(
    exchange: str, schedule: str, rotation: str, shuffle: bool
) -> None:
    """Every exchange: the emulator's worker 0 after one epoch is the written-out
    reference's (``tests/test_real.py``, which the real runtime equals)."""
    from tests.test_real import gossip_reference

    job = _job("gossip", gpus=4, batch=192, epochs=1)
    opts = {"exchange": exchange, "schedule": schedule, "rotation": rotation, "shuffle": shuffle}
    job = dataclasses.replace(job, options=opts)
    em = emulate(job, 1, keep_weights=True)
    ref = gossip_reference(job, schedule, rotation, shuffle, exchange)[0]
    _assert_weights(em.epoch_weights[1], ref)
    assert em.epochs[0]["disagreement"] > 0
