"""Errors raised when a trace file or name cannot be used."""

from __future__ import annotations


def unreadable(exc: BaseException) -> str:
    """Why a file could not be read, in a few words: the OS error, or for undecodable
    bytes which byte and where (the file is binary, or not UTF-8 text)."""
    if isinstance(exc, UnicodeDecodeError):
        bad = exc.object[exc.start : exc.start + 1]
        return (
            f"not UTF-8 text (byte 0x{bad.hex() or '??'} at offset {exc.start}); give a text file"
        )
    if isinstance(exc, OSError):
        return f"cannot read file: {exc.strerror or exc}"
    return str(exc)


class TraceError(ValueError):
    """Base class: a trace could not be found, read or understood."""


class TraceFormatError(TraceError):
    """A trace file is malformed. The message names the file, the field and the problem.

    Attributes:
        source: the file (or other source) that was read.
        field: the offending field's path (``layers[3].forward_s``, ``line 12``), or ``""``.
        problem: what is wrong with it.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source, self.field, self.problem = source, field, problem
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(f"{where}{problem}")


class UnknownModelError(TraceError):
    """A model name is neither a built-in trace nor a trace file."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        super().__init__(
            f"unknown model {name!r}: choose a built-in model ({', '.join(known)}) "
            "or give the path of a trace file (.json: dtsim or Kineto; PipeDream graph.txt; "
            "Chakra .et or a directory of them)"
        )
