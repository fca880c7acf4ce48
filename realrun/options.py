"""The profiler's choices and defaults (compute rates typed by people are parsed by
:func:`simcore.units.parse_flop_rate`).

No torch here: the command line builds its options and parses flags before it loads torch.
"""

from __future__ import annotations

from simcore.units import FLOP_RATE_EXAMPLES, parse_flop_rate

DTYPES = ("float32", "float16", "bfloat16")
"""Element types a model can be profiled in."""

DEVICES = ("cpu", "cuda")
"""Devices the profiler measures on."""

DEFAULT_EFFICIENCY = 0.5
"""Fraction of peak FLOP/s the analytic model's layers reach by default. Calibrated in
docs/traces.md against PipeDream's measured V100 profiles of ResNet-50 and Inception-v3."""

INPUT_SHAPE_HELP = (
    "shape of one input sample (float32, batch dimension left out), such as 3,32,32 or 64; "
    "needed when --model FILE.py:NAME returns only a module"
)
"""Help of the input-shape option of ``sim profile`` and ``sim real`` (one wording)."""

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEVICES",
    "DTYPES",
    "FLOP_RATE_EXAMPLES",
    "INPUT_SHAPE_HELP",
    "parse_flop_rate",
]
