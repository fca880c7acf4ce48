"""realrun.allocator: with freed memory kept, a step that allocates and frees the same
large buffers stops faulting fresh pages in (glibc's defaults fault them every step)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from realrun.allocator import _mallopt, keep_freed_memory

STEP = textwrap.dedent(
    """
    import resource, sys
    from realrun.allocator import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    n = 4 << 20
    ones = b"\\x01" * len(range(0, n, 4096))
    def step():  # a step's buffers: four of 4 MiB, each page written, all freed
        bufs = [bytearray(n) for _ in range(4)]
        for buf in bufs:
            buf[::4096] = ones
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
    """
)

needs_glibc = pytest.mark.skipif(_mallopt() is None, reason="no glibc mallopt on this system")


def faults_per_step(mode: str) -> float:
    """Minor page faults per step of :data:`STEP` in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", STEP, mode], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


@needs_glibc
def test_kept_memory_stops_the_page_faults_of_each_step() -> None:
    pages = 4 * (4 << 20) // 4096
    assert faults_per_step("system") > pages / 2  # glibc gives the 16 MiB back each step
    assert faults_per_step("keep") < 8


@needs_glibc
def test_keep_freed_memory_says_it_took_effect() -> None:
    assert keep_freed_memory() is True
