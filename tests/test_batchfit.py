"""Layer times as a fixed part plus a part per sample (traces.batchfit): the fit, the
rescaling it drives, the file format, and what the simulator makes of it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.batchfit import fit_batch_model, fit_line_through
from traces.errors import TraceFormatError
from traces.jsonfmt import from_dict, to_dict
from traces.model import Layer, TraceMeta, chain

FIXED = {"a": (1e-3, 2e-3), "b": (0.0, 5e-4)}  # forward, backward fixed seconds
PER_SAMPLE = {"a": (1e-4, 2e-4), "b": (3e-4, 6e-4)}


def profile_at(batch: int):
    """The trace a perfect profiler would measure at ``batch`` for the model above."""
    layers = [
        Layer(
            name,
            forward_s=FIXED[name][0] + PER_SAMPLE[name][0] * batch,
            backward_s=FIXED[name][1] + PER_SAMPLE[name][1] * batch,
            param_bytes=4000,
            activation_bytes=40 * batch,
        )
        for name in ("a", "b")
    ]
    return chain(TraceMeta("m", "cpu", batch), layers)


def test_a_line_through_two_points_is_exact() -> None:
    assert fit_line_through([4, 16], [1.4, 2.6]) == pytest.approx((1.0, 0.1))


def test_noise_that_would_make_a_time_fall_or_go_negative_is_kept_physical() -> None:
    # a time that fell as the batch grew: all of it fixed (the mean)
    assert fit_line_through([4, 16], [2.0, 1.8]) == pytest.approx((1.9, 0.0))
    # a line that crosses below zero: through the origin instead
    fixed, per = fit_line_through([4, 16], [0.1, 1.6])
    assert fixed == 0.0 and per == pytest.approx((0.4 + 25.6) / (16 + 256))
    with pytest.raises(ValueError, match="two or more different"):
        fit_line_through([8, 8], [1.0, 1.0])


@settings(max_examples=50, deadline=None)
@given(
    fixed=st.floats(0, 1.0),
    per=st.floats(1e-6, 1.0),
    batches=st.lists(st.integers(1, 512), min_size=2, max_size=5, unique=True),
)
def test_exact_times_give_back_their_line(fixed: float, per: float, batches: list[int]) -> None:
    got_fixed, got_per = fit_line_through(batches, [fixed + per * b for b in batches])
    assert got_fixed == pytest.approx(fixed, abs=1e-9 * (1 + per * max(batches)))
    assert got_per == pytest.approx(per, rel=1e-6)


def test_a_profile_at_two_batches_predicts_a_third() -> None:
    """Fitted at 32 and 8, the trace at 32 rescaled to 2 (a pipeline's micro-batch) has
    the times a profile at 2 would measure; proportional scaling makes them too short."""
    fitted = fit_batch_model([profile_at(8), profile_at(32)])
    assert fitted.meta.batch_size == 32
    assert [lay.forward_s for lay in fitted.layers] == [
        lay.forward_s for lay in profile_at(32).layers
    ]
    assert "fixed parts fitted over batches 8, 32" in fitted.meta.provenance
    small = fitted.rescale_batch(2)
    truth = profile_at(2)
    for got, want in zip(small.layers, truth.layers, strict=True):
        assert got.forward_s == pytest.approx(want.forward_s)
        assert got.backward_s == pytest.approx(want.backward_s)
        assert got.activation_bytes == want.activation_bytes
    proportional = profile_at(32).rescale_batch(2)
    assert proportional.forward_s < truth.forward_s
    assert small.forward_s == pytest.approx(truth.forward_s)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 256))
def test_without_fixed_parts_rescaling_stays_proportional(batch: int) -> None:
    trace = profile_at(16)
    scaled = trace.rescale_batch(batch)
    for before, after in zip(trace.layers, scaled.layers, strict=True):
        assert after.forward_s == pytest.approx(before.forward_s * batch / 16)
        assert after.backward_s == pytest.approx(before.backward_s * batch / 16)


def test_fits_refuse_profiles_of_other_graphs_or_one_batch() -> None:
    with pytest.raises(ValueError, match="two or more"):
        fit_batch_model([profile_at(8)])
    with pytest.raises(ValueError, match="must differ"):
        fit_batch_model([profile_at(8), profile_at(8)])
    other = chain(TraceMeta("m", "cpu", 4), [Layer("z", 1.0, 1.0)])
    with pytest.raises(ValueError, match="same layers"):
        fit_batch_model([profile_at(8), other])


def test_fixed_parts_survive_the_file_format_and_old_files_load() -> None:
    fitted = fit_batch_model([profile_at(8), profile_at(32)])
    data = to_dict(fitted)
    assert data["layers"][0]["forward_fixed_s"] == pytest.approx(1e-3)
    assert "forward_fixed_s" not in data["layers"][1]  # zero: not written
    assert from_dict(data) == fitted
    bad = to_dict(fitted)
    bad["layers"][0]["forward_fixed_s"] = 1.0
    with pytest.raises(TraceFormatError, match=r"layers\[0\]\.forward_fixed_s"):
        from_dict(bad, "t.json")


def test_the_simulated_pipeline_pays_each_micro_batchs_fixed_part() -> None:
    """GPipe with 8 micro-batches on a trace whose layers have fixed parts takes longer
    than on the proportional one: every micro-batch pass pays the fixed part."""
    import os
    import tempfile

    from analysis.resolve import build_config
    from simcore.engine import simulate
    from simcore.spec import RunSpec
    from traces.jsonfmt import save

    fitted = fit_batch_model([profile_at(8), profile_at(32)])
    plain = replace(
        fitted,
        layers=tuple(
            replace(lay, forward_fixed_s=0.0, backward_fixed_s=0.0) for lay in fitted.layers
        ),
    )
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, trace in (("fixed", fitted), ("plain", plain)):
            path = os.path.join(tmp, f"{name}.json")
            save(trace, path)
            spec = RunSpec().replace(
                scheme="gpipe", gpus=2, model=path, batch_size=32, iterations=2,
                topology="ethernet", scheme_options={"microbatches": 8},
            )  # fmt: skip
            times.append(simulate(build_config(spec, record_spans=False)).iteration_time_s)
    # each of 2 stages x 8 micro-batches pays its layer's fixed forward and backward
    assert times[0] > times[1]


def _run_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    from dtsim.cli import main

    with pytest.raises(SystemExit) as ex:
        main(list(args))
    out, err = capsys.readouterr()
    return ex.value.code, out, err


def test_sim_profile_fits_the_fixed_parts_at_a_second_batch(
    capsys: pytest.CaptureFixture, tmp_path: object
) -> None:
    pytest.importorskip("torch", reason="sim profile measures with torch (pip install .[real])")
    from traces.jsonfmt import load

    path = f"{tmp_path}/m.json"
    args = ["profile", "--model", "mlp_small", "--batch-size", "16", "--no-progress"]
    code, _, err = _run_main(capsys, *args, "--fit-batch", "4", "--out", path)
    assert code == 0, err
    trace = load(path)
    assert trace.meta.batch_size == 16
    assert "fixed parts fitted over batches 4, 16" in trace.meta.provenance
    for layer in trace.layers:
        assert 0 <= layer.forward_fixed_s <= layer.forward_s
        assert 0 <= layer.backward_fixed_s <= layer.backward_s
    assert any(layer.forward_fixed_s > 0 for layer in trace.layers)
    for bad, words in (("16", "smaller than --batch-size 16"), ("-1", "-1")):
        code, _, err = _run_main(capsys, *args, "--fit-batch", bad, "--out", path)
        assert code == 2 and words in err and "Traceback" not in err
