"""The profiler's choices and defaults, and compute rates typed by people (``15.7e12``,
``15.7TFLOPS``, ``312 TFLOP/s``).

No torch here: the command line builds its options and parses flags before it loads torch.
"""

from __future__ import annotations

import math
import re

from simcore.units import UnitError

_FLOP_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMGTP]?)"
                        r"\s*(?:flops|flop/s)?\s*$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
FLOP_RATE_EXAMPLES = "a compute rate such as 15.7e12, 15.7TFLOPS or 312 TFLOP/s"

DTYPES = ("float32", "float16", "bfloat16")
"""Element types a model can be profiled in."""

DEVICES = ("cpu", "cuda")
"""Devices the profiler measures on."""

DEFAULT_EFFICIENCY = 0.5
"""Fraction of peak FLOP/s the analytic model's layers reach by default. Calibrated in
docs/traces.md against PipeDream's measured V100 profiles of ResNet-50 and Inception-v3."""


def parse_flop_rate(value: str | float | int) -> float:
    """FLOP/s from ``15.7e12``, ``15.7TFLOPS``, ``900 GFLOP/s`` or a plain number.

    Raises :class:`~simcore.units.UnitError` for anything else or a rate that is not
    positive and finite.
    """
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not {FLOP_RATE_EXAMPLES}", FLOP_RATE_EXAMPLES)
    if isinstance(value, int | float):
        rate = float(value)
    else:
        m = _FLOP_RATE.match(value)
        if not m:
            raise UnitError(f"{value!r} is not {FLOP_RATE_EXAMPLES}", FLOP_RATE_EXAMPLES)
        rate = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if not (rate > 0 and math.isfinite(rate)):
        raise UnitError(f"the compute rate must be positive and finite, got {value!r}",
                        FLOP_RATE_EXAMPLES)
    return rate
