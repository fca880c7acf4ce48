"""The packages import one way: ``traces`` <- ``simcore`` <- ``realrun``, and ``analysis``
may use all three; ``dtsim`` (the command line) may use everything and nothing uses it.

Checked on the source with :mod:`ast`, imports inside functions included, so a lazy import
cannot hide a dependency that points the wrong way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("traces", "simcore", "realrun", "analysis", "dtsim")
ALLOWED = {
    "traces": {"traces"},
    "simcore": {"traces", "simcore"},
    "realrun": {"traces", "simcore", "realrun"},
    "analysis": {"traces", "simcore", "realrun", "analysis"},
    "dtsim": set(PACKAGES),
}
"""Package -> the first-party packages its modules may import."""


def modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """Absolute names of the first-party modules ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("import_module", "files")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)  # importlib.import_module("x"), resources.files("x")
    return {m for m in out if m.split(".")[0] in PACKAGES}


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    path = ROOT / "analysis" / "_probe_for_test.py"  # never written: only parsed
    src = "def f():\n    from dtsim.spec import RunSpec\n    from .store import x\n"
    tree_imports = _imports_of_source(src, path)
    assert {"dtsim.spec", "analysis.store"} <= tree_imports


def _imports_of_source(src: str, path: Path) -> set[str]:
    import unittest.mock

    with unittest.mock.patch.object(Path, "read_text", return_value=src):
        return imported(path)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    pkg = path.relative_to(ROOT).parts[0]
    wrong = sorted(m for m in imported(path) if m.split(".")[0] not in ALLOWED[pkg])
    assert not wrong, f"{pkg} may import only {sorted(ALLOWED[pkg])}; this imports {wrong}"


def test_no_import_cycles_between_modules():
    """No module reaches itself through the first-party imports (``a -> b -> a``)."""
    names = {module_name(p): p for p in modules()}

    def resolve(m: str) -> str | None:
        while m and m not in names:
            m = m.rpartition(".")[0]
        return m or None

    graph = {n: {r for m in imported(p) if (r := resolve(m)) and r != n} for n, p in names.items()}
    # packages' __init__ re-exports are how a package is entered; leave them out
    graph = {
        n: {m for m in deps if not _is_package(names[m])}
        for n, deps in graph.items()
        if not _is_package(names[n])
    }
    cycles = []
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycles.append(" -> ".join([*stack[stack.index(m) :], m]))
            elif m not in state:
                visit(m, [*stack, m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"
