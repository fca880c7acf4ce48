"""Concurrent flows on the emulated cluster (realrun.flows): the fit, and a real ring."""

import math
import secrets

import pytest

from realrun.flows import at, fit_spread, measure
from tests.helpers import netns_unavailable_reason


def test_the_share_is_the_ring_flows_mean_over_the_lone_flows_median():
    rows = [
        {"single_bytes_per_s": 10.0, "ring_bytes_per_s": [9.0, 11.0]},
        {"single_bytes_per_s": 12.0, "ring_bytes_per_s": [8.0, 12.0]},
        {"single_bytes_per_s": 10.0, "ring_bytes_per_s": [10.0, 10.0]},
    ]
    share, spread = fit_spread(rows)
    assert share == pytest.approx(10.0 / 10.0)
    # within-round variances 2, 8 and 0 pooled: sqrt(10 / 3) over the mean 10
    assert spread == pytest.approx(math.sqrt(10 / 3) / 10)


def test_rounds_that_differ_only_in_level_have_no_spread():
    """A round where every flow went slower (the machine was busier) moves the mean,
    not the spread: the spread is taken within rounds."""
    rows = [
        {"single_bytes_per_s": 10.0, "ring_bytes_per_s": [9.0, 9.0, 9.0]},
        {"single_bytes_per_s": 10.0, "ring_bytes_per_s": [7.0, 7.0, 7.0]},
    ]
    assert fit_spread(rows) == (pytest.approx(0.8), 0.0)


def test_no_rounds_cannot_be_fitted():
    with pytest.raises(ValueError, match="no rounds"):
        fit_spread([])


def test_between_measured_rates_the_share_and_spread_follow_the_log_of_the_rate():
    ladder = [
        {"rate_bytes_per_s": 1e6, "share": 0.90, "spread": 0.08},
        {"rate_bytes_per_s": 4e6, "share": 0.98, "spread": 0.02},
    ]
    assert at(ladder, 2e6) == (pytest.approx(0.94), pytest.approx(0.05))  # halfway in log
    assert at(ladder, 1e5) == (0.90, 0.08)  # the nearest measured rate outside them
    assert at(ladder, 1e9) == (0.98, 0.02)
    assert at([{"rate_bytes_per_s": 1e6, "share": 1.03, "spread": 0.0}], 1e6) == (1.0, 0.0)
    with pytest.raises(ValueError, match="no concurrent-flow"):
        at([], 1e6)


def test_a_rate_whose_ring_kept_the_cores_busy_is_left_out():
    """At rates where the links together carry more than the cores can move, the flows
    measure the machine (whose work the hosts' CPU model charges already), not the links:
    such an entry is not used, and a calibration with none left has even flows."""
    ladder = [
        {"rate_bytes_per_s": 1e6, "share": 0.95, "spread": 0.03, "cpu_bound": False},
        {"rate_bytes_per_s": 8e6, "share": 0.40, "spread": 0.10, "cpu_bound": True},
    ]
    assert at(ladder, 8e6) == (0.95, 0.03)
    assert at(ladder[1:], 8e6) == (1.0, 0.0)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"hosts": 1}, "hosts must be at least 2, got 1"),
        ({"rounds": 0}, "rounds must be"),
        ({"rates_bytes_per_s": [1e6, -1.0]}, "give positive rates"),
    ],
)
def test_bad_arguments_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        measure(**{"rates_bytes_per_s": [1e6], **kw})


_REASON = netns_unavailable_reason()


@pytest.mark.real
@pytest.mark.skipif(_REASON is not None, reason=f"network namespaces unavailable: {_REASON}")
def test_a_ring_of_flows_on_shaped_links_each_gets_at_most_the_rate():
    """Four hosts on links shaped to 40 Mbit/s: the lone flow and each ring flow carry
    between half the rate and the rate (TCP's framing keeps them below it), and the
    cluster is gone afterwards."""
    from realrun.netns import list_ours

    rate = 5e6
    prefix = f"dtfl{secrets.token_hex(3)}"
    (entry,) = measure([rate], hosts=4, rounds=1, duration_s=1.0, prefix=prefix)
    assert not list_ours(prefix)
    rows = entry["rounds"]
    assert entry["rate_bytes_per_s"] == rate and entry["hosts"] == 4
    assert len(rows) == 1 and len(rows[0]["ring_bytes_per_s"]) == 4
    for g in [rows[0]["single_bytes_per_s"], *rows[0]["ring_bytes_per_s"]]:
        assert 0.5 * rate < g <= 1.0 * rate
    assert (entry["share"], entry["spread"]) == fit_spread(rows)
    assert 0.5 < entry["share"] < 2.0 and entry["spread"] >= 0.0
    # four 40 Mbit/s flows leave most of the cores idle
    assert 0.0 <= rows[0]["machine_busy_share"] <= 1.0 and entry["cpu_bound"] is False
