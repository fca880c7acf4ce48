"""Quantities with units at the edges: parse once into seconds, bytes and bytes/s.

Inside the simulator every time is in seconds, every size in bytes and every rate in
bytes per second. These helpers turn what people type (``10Gbps``, ``25GB/s``,
``512MiB``, ``2us``) into those units and format them back for display.

Conventions: ``b`` is a bit, ``B`` a byte; decimal prefixes (k, M, G, T) are powers of
1000 and binary ones (Ki, Mi, Gi, Ti) powers of 1024, as in networking and JEDEC/IEC use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}

_RATE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
    r"(Ki|Mi|Gi|Ti|k|K|M|G|T|)(bps|b/s|bit/s|B/s|Bps)\s*$"
)
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(Ki|Mi|Gi|Ti|k|K|M|G|T|)(B)?\s*$")
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s|)\s*$")
_TIME_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}

RATE_EXAMPLES = "a rate with its unit, such as 10Gbps, 100Gb/s, 25GB/s or 12.5e9B/s"
SIZE_EXAMPLES = "a size such as 25MiB, 4096 or 1.5GB"
TIME_EXAMPLES = "a duration such as 2us, 0.5ms or 1e-6 (seconds)"


FLOP_RATE_EXAMPLES = "a compute rate such as 15.7e12, 15.7TFLOPS or 312 TFLOP/s"
_FLOP_RATE = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKMGTP]?)"
    r"\s*(?:flops|flop/s)?\s*$",
    re.IGNORECASE,
)
_FLOP_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}


class UnitError(ValueError):
    """A quantity could not be parsed; the message names the value and the accepted forms.

    ``expected`` says what would have been accepted (``a rate such as 10Gbps, ...``).
    """

    def __init__(self, message: str, expected: str = "") -> None:
        super().__init__(message)
        self.expected = expected


def parse_rate(value: str | float | int) -> float:
    """Bytes per second from ``10Gbps``, ``100Gb/s``, ``25GB/s``, ``12.5e9B/s`` or a
    number (``int``/``float``) of bytes per second. A string must carry its unit (a bare
    ``"10"`` is refused, saying how to write it). Raises :class:`UnitError` for anything
    else or a non-positive rate."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not {RATE_EXAMPLES}", RATE_EXAMPLES)
    if isinstance(value, int | float):
        rate = float(value)
    else:
        m = _RATE.match(value)
        if m:
            num, prefix, unit = m.groups()
            rate = float(num) * _PREFIX[prefix]
            if unit in ("bps", "b/s", "bit/s"):
                rate /= 8.0
        else:
            try:
                bare = float(value)
            except ValueError:
                raise UnitError(f"{value!r} is not {RATE_EXAMPLES}", RATE_EXAMPLES) from None
            # A bare number is ambiguous (bits or bytes? giga?): ``--bandwidth 10`` would be
            # 10 bytes/s. Say how to write what was probably meant.
            num = value.strip()
            hint = (
                f"a rate with its unit: {num!r} alone is not one; write {num}Gbps "
                f"(gigabits/s), {num}GB/s (gigabytes/s) or {num}B/s (bytes/s, "
                f"{format_rate(bare) if bare > 0 else 'not positive'})"
            )
            raise UnitError(f"{value!r} has no unit", hint)
    if not rate > 0 or rate == float("inf"):
        raise UnitError(
            f"bandwidth must be positive and finite, got {value!r}", "a positive, finite rate"
        )
    return rate


def _number_with_unit(
    value: str | float | int, pattern: re.Pattern[str], scale: Callable[[str], float], examples: str
) -> float:
    """A plain number, or the number and unit ``pattern`` captures times ``scale(unit)``;
    :class:`UnitError` naming ``examples`` for anything else (booleans included)."""
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is not {examples}", examples)
    if isinstance(value, int | float):
        return float(value)
    m = pattern.match(value)
    if not m:
        raise UnitError(f"{value!r} is not {examples}", examples)
    return float(m.group(1)) * scale(m.group(2))


def parse_size(value: str | float | int) -> int:
    """Bytes from ``25MiB``, ``1.5GB``, ``4096`` (rounded to a whole byte, >= 0)."""
    size = _number_with_unit(value, _SIZE, _PREFIX.__getitem__, SIZE_EXAMPLES)
    if size < 0 or size == float("inf"):
        raise UnitError(
            f"size must be non-negative and finite, got {value!r}", "a non-negative, finite size"
        )
    return round(size)


def parse_time(value: str | float | int) -> float:
    """Seconds from ``2us``, ``0.5ms``, ``1e-6`` (>= 0)."""
    t = _number_with_unit(value, _TIME, _TIME_SCALE.__getitem__, TIME_EXAMPLES)
    if t < 0 or t == float("inf"):
        raise UnitError(
            f"duration must be non-negative and finite, got {value!r}",
            "a non-negative, finite duration",
        )
    return t


def parse_flop_rate(value: str | float | int) -> float:
    """FLOP/s from ``15.7e12``, ``15.7TFLOPS``, ``900 GFLOP/s`` or a plain number.

    Raises :class:`UnitError` for anything else or a rate that is not positive and finite.
    """
    rate = _number_with_unit(
        value, _FLOP_RATE, lambda u: _FLOP_SCALE[u.lower()], FLOP_RATE_EXAMPLES
    )
    if not (rate > 0 and math.isfinite(rate)):
        raise UnitError(
            f"the compute rate must be positive and finite, got {value!r}", FLOP_RATE_EXAMPLES
        )
    return rate


def format_rate(bytes_per_s: float) -> str:
    """``1.25e9`` -> ``10 Gbps`` (bits per second, decimal prefixes)."""
    bits = bytes_per_s * 8
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.4g} {prefix}bps"
    return f"{bits:.4g} bps"


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB`` (binary prefixes)."""
    for prefix, scale in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}B"
    return f"{n:.0f} B"


def format_time(seconds: float) -> str:
    """``0.0123`` -> ``12.3 ms``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"
