"""The scheduler benchmark: its simulation on per-core run queues, the fit of the
load-balancing delay, and one short real run on this machine."""

from __future__ import annotations

import os

import pytest

from realrun.scheduler import BALANCE_GRID_S, SEEDS, fit_balance, measure, simulate_cycles

ROWS = [
    {"processes": 3, "compute_s": 8e-3, "sleep_s": 4e-3, "duration_s": 2.0},
    {"processes": 3, "compute_s": 40e-3, "sleep_s": 20e-3, "duration_s": 3.0},
]


def test_threads_no_more_than_cores_never_wait():
    # two threads on two cores: each cycle is its compute and its sleep (within the jitter)
    row = {"processes": 2, "compute_s": 8e-3, "sleep_s": 4e-3, "duration_s": 1.2}
    for balance in (0.0, 5e-3):
        got = simulate_cycles(row, 2, balance)
        assert abs(got - 2 * 1.2 / 12e-3) <= 4


def test_idle_cores_beside_queued_threads_cost_cycles():
    # three threads on two cores: per-core queues that never balance leave a core idle
    # while two threads share the other, so the long-cycle row does fewer cycles than
    # with a quick balancer, and never more than two busy cores allow
    row = ROWS[1]
    quick = simulate_cycles(row, 2, 1e-3)
    never = simulate_cycles(row, 2, 1e3)
    assert never < quick
    assert quick * row["compute_s"] <= 2 * row["duration_s"] + row["compute_s"]


def test_same_seed_same_cycles():
    assert simulate_cycles(ROWS[0], 2, 5e-3, seed=3) == simulate_cycles(ROWS[0], 2, 5e-3, seed=3)


@pytest.mark.parametrize("balance", [2e-3, 8e-3, 24e-3])
def test_the_fit_recovers_the_delay_that_made_the_rows(balance):
    rows = [
        {**r, "cycles": round(sum(simulate_cycles(r, 2, balance, s) for s in range(SEEDS)) / SEEDS)}
        for r in ROWS
    ]
    got, residual = fit_balance(rows, 2)
    assert got in BALANCE_GRID_S
    # the grid's neighbours may do the same cycles within a rounding: the fit leaves
    # (almost) nothing
    assert residual < 0.01
    assert abs(got - balance) <= 4e-3


def test_no_cycles_cannot_be_fitted():
    with pytest.raises(ValueError, match="did no cycles"):
        fit_balance([{**ROWS[0], "cycles": 0}], 2)


@pytest.mark.real
def test_the_benchmark_runs_on_this_machine():
    """One short row for real: as many processes as cores plus one, every one of them
    cycling, the cycles within what the cores allow, and the sleeps about as long as
    asked."""
    cores = len(os.sched_getaffinity(0))
    (row,) = measure(cores, cycles=((4e-3, 2e-3, 0.6),))
    assert row["processes"] == cores + 1
    assert row["cycles"] >= cores + 1
    assert row["cycles"] * row["compute_s"] <= cores * row["duration_s"] + (cores + 1) * 4e-3
    assert 2e-3 <= row["slept_s"] < 20e-3
    balance, _residual = fit_balance([row], cores)
    assert balance in BALANCE_GRID_S
