"""Keeping freed memory in the process: glibc's ``malloc`` tuned so that a loop which
allocates and frees the same large buffers every step stops faulting them in again.

glibc gives a block above its mmap threshold (128 KiB at first, raised as such blocks are
freed, at most 32 MiB) pages of its own from the kernel and returns them when the block is
freed, and it gives the heap's free top back to the kernel once that exceeds the trim
threshold (twice the mmap threshold). A step that allocates a few MB of activations and
gradients and frees them all then touches fresh pages every time, and in a virtual machine
those page faults cost as much as a small convolution, at a price that moves with the
host's load. :func:`keep_freed_memory` sets the mmap threshold to glibc's largest and the
trim threshold to 1 GiB, so the pages stay with the process for the next step (what a
caching allocator such as jemalloc or TCMalloc does, and PyTorch's CPU performance guide
advises). The machine-speed probe (:func:`realrun.runtime_profile.compute_probe_s`) runs
with it, so that it times compute and not the kernel's page faults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Blocks up to this size come from the heap (glibc's largest mmap threshold on 64-bit
systems; it refuses a larger one)."""
TRIM_THRESHOLD_BYTES = 1024 * 1024 * 1024
"""Free memory at the heap's top goes back to the kernel only beyond this."""


@cache
def _mallopt() -> Any:
    """glibc's ``mallopt``, or ``None`` where the C library has none."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed memory for reuse from now on (module
    docs); returns whether it could (``False`` without glibc's ``mallopt``)."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
