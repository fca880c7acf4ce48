"""How a setting is declared and how a value typed by a person becomes its typed value.

Every setting of the tool, a run's (``gpus``, ``chunk_bytes``...) as well as a scheme's
(``scheme.algorithm``...), is a field of a frozen dataclass declared with :func:`setting`.
The field's metadata says everything the rest of the tool needs: help text, the kind of
value (``int``, ``bytes``, ``rate``...), the allowed choices and limits, what ``None``
stands for when the setting may be left to the tool (``auto``), and whether the command
line shows it as a flag. :func:`convert` is the one converter: the command line, config
files, ``--set``, sweeps and the dataclasses' own ``__post_init__`` all go through it, so a
value is parsed once and a bad one gives the same message wherever it was typed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any

from simcore.units import UnitError, parse_rate, parse_size, parse_time

KINDS = ("int", "float", "bool", "str", "bytes", "rate", "seconds")
"""Kinds of value: plain types, and numbers with a unit (sizes in bytes, rates in bytes/s,
durations in seconds), which accept a unit suffix (``4MiB``, ``10Gbps``, ``5us``)."""

UNIT_KINDS = {"bytes": parse_size, "rate": parse_rate, "seconds": parse_time}

TYPE_WORDS = {
    "int": "an integer",
    "float": "a finite number",
    "bool": "true or false",
    "str": "a string",
}
"""How messages name the type a value should have had."""

AUTO_WORDS = ("", "auto")
"""Texts that leave a setting that allows it (``auto=...``) to the tool."""


class ConfigError(ValueError):
    """A setting's value is not allowed. The message names the setting (by its field
    name; the command line shows its flag instead), the bad value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str, unknown: bool = False) -> None:
        self.field, self.value, self.allowed, self.unknown = field_name, value, allowed, unknown
        super().__init__(self.describe(field_name))

    def describe(self, shown_name: str) -> str:
        """The message, with the field shown as ``shown_name`` (e.g. a CLI flag)."""
        if self.unknown:
            return f"{shown_name}: unknown setting; {self.allowed}"
        return f"{shown_name}: {self.value!r} is not allowed; {self.allowed}"


def setting(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    below: float | None = None,
    positive: bool = False,
    limit_help: str = "",
    auto: str | None = None,
    auto_zero: bool = False,
    flag: int = 0,
    metavar: str | None = None,
) -> Any:
    """A dataclass field declaring one setting.

    Args:
        default: its value when nobody sets it (``None`` with ``auto``: left to the tool).
        help: one line for ``--help`` and ``sim schemes -v``.
        kind: one of :data:`KINDS`; by default the field's annotated type.
        choices: the allowed strings (or a function returning them, read when needed).
        minimum / maximum / below: numbers must be ``>= minimum``, ``<= maximum`` and
            ``< below``.
        positive: numbers must be ``> 0``.
        limit_help: what a limit error says instead of the generic words.
        auto: what the tool does when the setting is left unset (``None``); the setting
            then accepts ``auto`` or an empty text for that.
        auto_zero: 0 also means ``auto`` (the setting's older spelling).
        flag: position of the setting's flag in ``sim run --help`` (0: no flag; it is set
            with ``--set`` or a config file).
        metavar: what the flag's value looks like in ``--help``.
    """
    meta = {
        "help": help,
        "kind": kind,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "below": below,
        "positive": positive,
        "limit_help": limit_help,
        "auto": auto,
        "auto_zero": auto_zero,
        "flag": flag,
        "metavar": metavar,
    }
    return field(default=default, metadata=meta)


def kind_of(f: dataclasses.Field) -> str:
    """The kind of value of field ``f`` (see :data:`KINDS`)."""
    kind = f.metadata.get("kind") or f.metadata.get("unit")
    if kind:
        return str(kind)
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    typ = typ.replace(" | None", "").strip()
    return typ if typ in TYPE_WORDS else "str"


def choices_of(f: dataclasses.Field) -> tuple[str, ...] | None:
    """The allowed strings of field ``f``, or ``None`` when any value of its kind is."""
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def convert(f: dataclasses.Field, value: Any, where: str | None = None) -> Any:
    """``value`` (typed, or text as a person wrote it) as the typed value of field ``f``;
    :class:`ConfigError` naming ``where`` (default: the field's name), the value and what
    is allowed when it does not fit."""
    return convert_value(
        value, where or f.name, kind_of(f), {**f.metadata, "choices": choices_of(f)}
    )


def convert_value(value: Any, where: str, kind: str, limits: Mapping[str, Any]) -> Any:
    """``value`` as a value of ``kind`` (one of :data:`KINDS`) for a setting named
    ``where`` in messages, within ``limits``: the arguments of :func:`setting` that limit
    a value (``choices``, a tuple, ``minimum``, ``maximum``, ``below``, ``positive``,
    ``limit_help``, ``auto``, ``auto_zero``; one left out does not limit it). The
    converter :func:`convert` applies to a declared field, for declarations that are not
    dataclass fields (a preset's keys, :mod:`simcore.preset_keys`)."""
    auto, choices, limit_help = limits.get("auto"), limits.get("choices"), limits.get("limit_help")
    minimum, maximum, below = limits.get("minimum"), limits.get("maximum"), limits.get("below")
    if auto is not None and (
        value is None
        or (isinstance(value, str) and value.strip().lower() in AUTO_WORDS)
        or (
            limits.get("auto_zero")
            and not isinstance(value, bool)
            and isinstance(value, int | float | str)
            and _is_zero(value)
        )
    ):
        return None
    try:
        if kind in UNIT_KINDS:  # (anything but a number is read as text: the parser names it)
            out: Any = UNIT_KINDS[kind](
                value if isinstance(value, str | int | float) else str(value)
            )
        elif kind == "bool":
            out = parse_bool(value, where)
        elif kind == "int":
            out = parse_int(value, where)
        elif kind == "float":
            if isinstance(value, bool):
                raise ValueError
            out = float(value)
            if not math.isfinite(out):
                raise ValueError
        else:
            if value is None or isinstance(value, Mapping | list | tuple):
                raise ValueError
            out = str(value)
    except UnitError as exc:
        raise ConfigError(where, value, f"expected {exc.expected}") from None
    except (TypeError, ValueError):  # TypeError: float() of a mapping or None
        raise ConfigError(where, value, f"expected {TYPE_WORDS.get(kind, kind)}") from None
    if choices is not None and out not in choices:
        raise ConfigError(where, value, f"choose one of: {', '.join(choices)}")
    shown = out if kind in UNIT_KINDS else value  # a limit is about the value in its unit
    if minimum is not None and out < minimum:
        raise ConfigError(where, shown, limit_help or f"must be at least {minimum:g}")
    if maximum is not None and out > maximum:
        raise ConfigError(where, shown, limit_help or f"must be at most {maximum:g}")
    if below is not None and out >= below:
        raise ConfigError(where, shown, limit_help or f"must be below {below:g}")
    if limits.get("positive") and not out > 0:
        raise ConfigError(where, shown, limit_help or "must be positive")
    return out


def _is_zero(value: Any) -> bool:
    try:
        return float(value) == 0
    except (TypeError, ValueError):
        return False


def parse_bool(value: Any, where: str) -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case) or a bool."""
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ConfigError(where, value, "expected true or false")


def parse_int(value: Any, where: str) -> int:
    """An integer from an int, a whole float or a string (``ValueError`` otherwise)."""
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError
        return int(value)
    return int(str(value).strip())


def parse_quantity(parse: Callable[[Any], Any], value: Any, field_name: str) -> Any:
    """``parse(value)`` (a parser of :mod:`simcore.units`), with a :class:`ConfigError`
    naming ``field_name``, the value and the accepted forms when it does not parse."""
    try:
        return parse(value)
    except UnitError as exc:
        raise ConfigError(field_name, value, f"expected {exc.expected}") from None


def normalise(obj: Any, names: tuple[str, ...] | None = None) -> None:
    """Convert, in place, the fields ``names`` (default: all declared with
    :func:`setting`) of frozen dataclass instance ``obj`` to their typed values; called by
    ``__post_init__`` so that an instance built from text and one built from typed values
    are equal, and no instance holds a value its declaration does not allow."""
    for f in dataclasses.fields(obj):
        if "help" not in f.metadata or (names is not None and f.name not in names):
            continue
        value = getattr(obj, f.name)
        out = convert(f, value)
        if out is not value:
            object.__setattr__(obj, f.name, out)


def from_mapping(cls: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    """An instance of settings dataclass ``cls`` from a mapping of field name to value
    (text or typed). Unknown names raise :class:`ConfigError` listing the known ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            known = ", ".join(fields) or "(none)"
            raise ConfigError(f"{prefix}{key}", value, f"known: {known}", unknown=True)
        kwargs[key] = convert(fields[key], value, f"{prefix}{key}")
    return cls(**kwargs)


def describe(cls: type) -> list[tuple[str, Any, str]]:
    """``(name, default, help)`` of every field of a settings dataclass."""
    return [(f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(cls)]
