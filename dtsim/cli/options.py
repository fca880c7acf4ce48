"""Options shared by the commands that describe a run (``sim run``, and ``sim real``),
generated from the declaration of the run settings (:class:`~simcore.spec.RunSpec`), and
turning them into a spec."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import click

from analysis.resolve import load_config_file
from simcore.settings import choices_of, kind_of
from simcore.spec import RunSpec, apply_settings, flag_fields, parse_set


class LazyChoice(click.Choice):
    """A ``click.Choice`` whose values are read each time they are needed, from a
    function: the scheme registry, for one, lists whatever scheme modules exist."""

    def __init__(self, values: Callable[[], Any]) -> None:
        self._values = values
        super().__init__((), case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return tuple(self._values())

    @choices.setter
    def choices(self, _value: Any) -> None:
        pass


def flag_of(name: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _show(f: dataclasses.Field) -> str:
    """The default of a setting, as ``--help`` shows it."""
    if f.metadata.get("auto") is not None and f.default is None:
        return str(f.metadata["auto"])
    if kind_of(f) == "bytes":
        from simcore.units import format_bytes

        return format_bytes(f.default)
    return str(f.default) if f.default != "" else "''"


def setting_option(f: dataclasses.Field, *, as_list: bool = False) -> Callable[..., Any]:
    """The click option of setting ``f``: its value goes through the setting's converter
    (the option's default is ``None``, so that the declaration's default applies unless the
    flag is given). ``as_list``: a comma-separated list of values (``sim sweep``)."""
    meta = f.metadata
    choices = meta.get("choices")
    if as_list:
        typ: Any = str
        metavar = "LIST"
    elif callable(choices):
        typ, metavar = LazyChoice(lambda: choices_of(f)), None
    elif choices is not None:
        typ, metavar = click.Choice(list(choices)), None
    else:
        typ = int if kind_of(f) == "int" and meta.get("auto") is None else str
        metavar = meta.get("metavar") or ("INTEGER" if kind_of(f) == "int" else "TEXT")
    help_ = meta["help"][0].upper() + meta["help"][1:]
    if "[default:" not in help_:
        help_ += f". [default: {_show(f)}]"
    if as_list:
        help_ = "Comma-separated values of: " + help_[0].lower() + help_[1:]
    return click.option(
        flag_of(f.name), f.name, type=typ, default=None, metavar=metavar, help=help_
    )


def out_option(
    help: str,
    *,
    folder: bool = False,
    default: str | None = None,
    metavar: str | None = None,
    dest: str = "out",
) -> Callable[..., Any]:
    """The ``-o``/``--out`` option every command that writes results declares: a file, or
    with ``folder`` a folder, shown as ``FILE``/``DIR`` unless ``metavar`` says otherwise;
    ``default`` is shown in ``--help`` when there is one. The path is not checked here:
    commands check it before their work (``dtsim.cli.output.check_output`` /
    ``check_output_dir``), with messages that say what is wrong with it."""
    return click.option(
        "-o",
        "--out",
        dest,
        type=click.Path(),
        default=default,
        show_default=default is not None,
        metavar=metavar or ("DIR" if folder else "FILE"),
        help=help,
    )


def run_options(f: Callable[..., Any], spec_cls: type = RunSpec) -> Callable[..., Any]:
    """Decorate a command with the options that describe one run: a flag for each setting
    of ``spec_cls`` declared with ``flag=N``, ``--config`` and ``--set``."""
    opts = [setting_option(field) for field in flag_fields(spec_cls)]
    opts += [
        click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False),
            default=None,
            metavar="FILE",
            help="YAML/JSON file of settings (same keys as --set).",
        ),
        click.option(
            "--set",
            "settings",
            multiple=True,
            metavar="KEY=VALUE",
            help="Any other setting, e.g. warmup_iterations=2, chunk_bytes=4MiB, "
            "nic_per_gpu=true, scheme.algorithm=tree (repeatable).",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def spec_from_params(ctx: click.Context, params: dict[str, Any], spec_cls: type = RunSpec) -> Any:
    """The spec: defaults, then ``--config``, then flags given explicitly, then ``--set``."""
    merged: dict[str, Any] = {}
    if params.get("config_file"):
        if not os.path.exists(params["config_file"]):
            raise click.BadParameter(
                f"{params['config_file']!r} does not exist", param_hint="'--config'"
            )
        merged.update(load_config_file(params["config_file"]))
    for field in flag_fields(spec_cls):
        value = params.get(field.name)
        if value is not None:
            merged[field.name] = value
    merged.update(parse_set(params.get("settings") or ()))
    return apply_settings(spec_cls(), merged)
