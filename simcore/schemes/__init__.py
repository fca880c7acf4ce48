"""Training schemes, one module and one class per scheme, registered by name.

The registry key is the module name and the CLI string (``sim run --scheme dp``). A scheme
module defines a :class:`~simcore.schemes.base.Scheme` subclass with ``name`` equal to the
module name; adding a module here is all it takes to add a scheme.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from simcore.config import ConfigError
from simcore.schemes.base import Scheme

_NOT_SCHEMES = {"base"}


@cache
def registry() -> dict[str, type[Scheme]]:
    """All schemes by name, in a stable order (the order of :data:`ORDER`, then others)."""
    found: dict[str, type[Scheme]] = {}
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("_") or mod.name in _NOT_SCHEMES:
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Scheme) and obj is not Scheme
                    and obj.name == mod.name):
                found[obj.name] = obj
    ordered = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    return {n: found[n] for n in ordered}


ORDER = ("dp", "ps", "p3", "gossip", "mp", "gpipe", "pipedream", "spectrain")
"""Display order of the schemes."""


def get_scheme(name: str) -> type[Scheme]:
    """The scheme class called ``name`` (``ConfigError`` listing the known names)."""
    reg = registry()
    if name not in reg:
        raise ConfigError("scheme", name, f"choose one of: {', '.join(reg)}")
    return reg[name]


__all__ = ["ORDER", "Scheme", "get_scheme", "registry"]
