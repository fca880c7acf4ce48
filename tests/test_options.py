"""Compute rates at the edge, and analytic traces rescaled between devices."""

from __future__ import annotations

import pytest

from dtsim.resolve import device_scale
from realrun.options import parse_flop_rate
from simcore.units import UnitError


@pytest.mark.parametrize(
    "text, rate",
    [
        ("15.7e12", 15.7e12),
        ("15.7TFLOPS", 15.7e12),
        ("312 TFLOP/s", 312e12),
        ("900G", 900e9),
        (2e9, 2e9),
    ],
)
def test_flop_rates(text: str | float, rate: float) -> None:
    assert parse_flop_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["fast", "0", "-1e12", "15.7 TB/s", "inf"])
def test_bad_flop_rates_name_the_value(text: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_flop_rate(text)
    assert repr(text) in str(info.value)


def test_analytic_device_is_rescaled_by_its_own_peak() -> None:
    assert device_scale("analytic:1.57e+13", "A100", 19.5e12) == pytest.approx(19.5 / 15.7)
    assert device_scale("cpu", "A100", 19.5e12) == 1.0
    assert device_scale("analytic:bogus", "A100", 19.5e12) == 1.0
