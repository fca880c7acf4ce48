"""The names of the training schemes, listed from the module files of
:mod:`simcore.schemes` without importing them: a scheme's module name is its name, with
``_`` for ``-`` (see :mod:`simcore.schemes`). Kept apart from the registry so that the settings
(:mod:`simcore.config`) can offer the names as choices without importing the schemes,
which import the settings."""

from __future__ import annotations

import pkgutil
from functools import cache
from pathlib import Path

SCHEME_PATHS = [str(Path(__file__).with_name("schemes"))]
"""The folders searched for scheme modules: ``simcore.schemes``'s ``__path__`` (a test
that adds a scheme from a folder of its own extends both)."""

NOT_SCHEMES = frozenset({"base"})
"""Modules of that folder that are not schemes (private ``_name`` modules are not either)."""

ORDER = (
    "dp",
    "ps",
    "p3",
    "gossip",
    "mp",
    "gpipe",
    "pipedream",
    "spectrain",
    "1f1b",
    "interleaved",
    "looped-bfs",
    "zb-h1",
    "zb-interleaved",
    "zbv",
    "dualpipev",
)
"""Display order of the schemes (others follow by name)."""


@cache
def scheme_names() -> tuple[str, ...]:
    """The names of all schemes, in display order, without importing their modules (a
    module's ``_`` is a name's ``-``: ``zb_h1`` is ``zb-h1``)."""
    found = {
        mod.name.replace("_", "-")
        for mod in pkgutil.iter_modules(SCHEME_PATHS)
        if not mod.name.startswith("_") and mod.name not in NOT_SCHEMES
    }
    return tuple([n for n in ORDER if n in found] + sorted(found - set(ORDER)))
