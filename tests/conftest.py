"""Shared test settings and fixtures: one torch thread (the machine has two cores and some
tests time code), and small synthetic traces."""

from __future__ import annotations

import importlib.util

import pytest

from traces import Layer, Trace, TraceMeta, chain


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    """Torch-using tests run single-threaded; without torch nothing needs doing (tests
    that need it skip themselves)."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)


def synthetic_trace(
    n_layers: int = 4,
    fwd_s: float = 0.01,
    bwd_s: float = 0.02,
    param_bytes: int = 1_000_000,
    act_bytes: int = 100_000,
    batch: int = 8,
    device: str = "V100",
) -> Trace:
    """A chain of equal layers."""
    layers = [
        Layer(f"l{i}", fwd_s, bwd_s, param_bytes=param_bytes, activation_bytes=act_bytes)
        for i in range(n_layers)
    ]
    return chain(TraceMeta("synthetic", device, batch), layers)


@pytest.fixture
def small_trace() -> Trace:
    return synthetic_trace()
