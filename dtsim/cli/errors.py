"""Which exceptions are the user's to fix, and how to say so in one line."""

from __future__ import annotations

import click

from simcore.config import ConfigError
from simcore.engine import SimulationError
from simcore.topology import TopologyError
from simcore.units import UnitError
from traces.atomic import OutputPathError
from traces.errors import TraceError

USER_ERRORS = (ConfigError, TraceError, TopologyError, UnitError, OutputPathError)


def flag_name(field: str, command: click.Command | None = None) -> str:
    """How the command line names setting ``field``: the option or argument of
    ``command`` that sets it (``batch_size`` -> ``--batch-size``, ``out`` -> ``--out``,
    ``results`` -> ``RESULTS``); other names (settings given with ``--set``, like
    ``chunk_bytes`` or ``scheme.algorithm``) unchanged. The layers below name settings by
    their field names only."""
    if command is None:
        from simcore.spec import FLAG_FIELDS

        return "--" + field.replace("_", "-") if field in FLAG_FIELDS else field
    for param in command.params:
        if isinstance(param, click.Argument):
            if param.name == field:
                return param.human_readable_name
            continue
        longs = [o for o in param.opts if o.startswith("--")] or list(param.opts)
        names = {param.name, *(o.lstrip("-").replace("-", "_") for o in param.opts)}
        if field in names and longs:
            return longs[0]
    return field


def exit_code_and_message(
    exc: BaseException, command: click.Command | None = None
) -> tuple[int | None, str]:
    """``(exit code, one-line message)`` for a user-facing error (settings named as
    ``command`` names them); ``(None, "")`` for a bug (which should surface with its
    traceback)."""
    if isinstance(exc, click.ClickException):
        return exc.exit_code, " ".join(exc.format_message().split())
    if isinstance(exc, ConfigError):
        return 2, exc.describe(flag_name(exc.field, command))
    if isinstance(exc, USER_ERRORS):
        return 2, " ".join(str(exc).split())
    if isinstance(exc, SimulationError):
        return 1, str(exc)
    from realrun.calibration import CalibrationError
    from realrun.job import JobError
    from realrun.launch import RankFailed
    from realrun.netns import NetnsUnavailable

    if isinstance(exc, JobError | NetnsUnavailable):
        return 2, " ".join(str(exc).split())
    if isinstance(exc, RankFailed | CalibrationError):
        return 1, " ".join(str(exc).split())
    if isinstance(exc, OSError):
        return 1, f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
    return None, ""


def with_output_option(message: str, args: list[str]) -> str:
    """An output error's ``message`` (it starts with the path) led by the option in the
    command line ``args`` that gave that path (``--trace-out x.json`` or
    ``--trace-out=x.json``); as it is when no option gave it."""
    for i, arg in enumerate(args):
        if arg.startswith("--") and "=" in arg:
            option, value = arg.split("=", 1)
        else:
            option, value = (args[i - 1] if i else ""), arg
        if option.startswith("-") and value and message.startswith((value + ":", value + " (")):
            return f"{option}: {message}"
    return message


class BadInput(click.ClickException):
    """A user error reported by a command itself: one line, exit code 2."""

    exit_code = 2


def as_click_error(
    exc: Exception, command: click.Command | None = None
) -> click.ClickException | None:
    """The one-line :class:`click.ClickException` for a user-facing error (with its exit
    code), or ``None`` for a bug, which should surface with its traceback."""
    if isinstance(exc, click.ClickException):
        return exc
    code, message = exit_code_and_message(exc, command)
    if code is None:
        return None
    err = BadInput(message)
    err.exit_code = code
    return err
