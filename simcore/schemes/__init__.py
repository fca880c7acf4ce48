"""Training schemes, one module and one class per scheme, registered by name.

The registry key is the module name and the CLI string (``sim run --scheme dp``), with
``-`` for ``_`` (module ``zb_h1`` is scheme ``zb-h1``). A scheme
module defines a :class:`~simcore.schemes.base.Scheme` subclass with ``name`` equal to the
module name; adding a module here is all it takes to add a scheme. Because the module
name is the scheme name, :func:`scheme_names` lists the schemes without importing them
and :func:`get_scheme` imports only the one asked for (the pipeline schemes pull in the
partitioner and numpy, which ``sim run --scheme dp`` does not need).
"""

from __future__ import annotations

import importlib
from functools import cache

from simcore.config import ConfigError
from simcore.scheme_names import ORDER, scheme_names
from simcore.schemes.base import Scheme

__all__ = ["ORDER", "Scheme", "get_scheme", "registry", "scheme_names", "schemes_where"]


@cache
def get_scheme(name: str) -> type[Scheme]:
    """The scheme class called ``name`` (``ConfigError`` listing the known names)."""
    names = scheme_names()
    if name not in names:
        raise ConfigError("scheme", name, f"choose one of: {', '.join(names)}")
    module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
    for obj in vars(module).values():
        if (
            isinstance(obj, type)
            and issubclass(obj, Scheme)
            and obj is not Scheme
            and obj.name == name
        ):
            return obj
    raise ConfigError(
        "scheme",
        name,
        f"module simcore.schemes.{name.replace('-', '_')} defines no Scheme subclass "
        f"named {name!r}",
    )


def registry() -> dict[str, type[Scheme]]:
    """All schemes by name, in display order (imports every scheme module)."""
    return {name: get_scheme(name) for name in scheme_names()}


def schemes_where(attribute: str) -> tuple[str, ...]:
    """The names of the schemes whose class ``attribute`` is true (a flag set, a name
    given), in display order (imports every scheme module): ``schemes_where("pipeline")``,
    ``schemes_where("real_runtime")``."""
    return tuple(name for name, cls in registry().items() if getattr(cls, attribute))
