"""Shared test settings: one torch thread (the machine has two cores and tests run
timing code), and helpers to skip what needs torch or a GPU."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> None:
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
