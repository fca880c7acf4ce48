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


def import_graph(imports: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Module -> the first-party modules importing it runs: ``imports`` maps each module
    to the names it imports; ``packages`` names the modules that are packages'
    ``__init__``. Importing ``a.b.c`` runs ``a`` and ``a.b`` first, so an edge to it is
    also one to them (except to the importer's own packages, which Python runs first)."""
    names = set(imports)

    def resolve(m: str) -> str | None:
        while m and m not in names:
            m = m.rpartition(".")[0]
        return m or None

    graph = {n: {r for m in deps if (r := resolve(m)) and r != n} for n, deps in imports.items()}
    for n, deps in graph.items():
        for m in list(deps):
            parent = m.rpartition(".")[0]
            while parent:
                if parent in packages and parent != n and not n.startswith(parent + "."):
                    deps.add(parent)
                parent = parent.rpartition(".")[0]
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of ``graph`` closes, as ``a -> b -> a``."""
    cycles: list[str] = []
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
    return cycles


def test_the_cycle_check_sees_packages_init_modules():
    # pkg/__init__ imports pkg.a lazily; pkg.b imports pkg.sub.c, which runs pkg.sub first
    imports = {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c"},
        "pkg.sub": {"pkg.a"},
        "pkg.sub.c": set(),
    }
    cycles = find_cycles(import_graph(imports, {"pkg", "pkg.sub"}))
    assert cycles == ["pkg.a -> pkg.b -> pkg.sub -> pkg.a"]
    # a module importing a sibling does not import its own package again: it is running
    assert (
        find_cycles(import_graph({"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}, {"pkg"}))
        == []
    )
    # but one that takes a name from its package's __init__ does, while that runs
    assert find_cycles(import_graph({"pkg": {"pkg.a"}, "pkg.a": {"pkg"}}, {"pkg"})) == [
        "pkg -> pkg.a -> pkg"
    ]


def test_no_import_cycles_between_modules():
    """No module reaches itself through the first-party imports (``a -> b -> a``),
    packages' ``__init__`` modules included."""
    paths = {module_name(p): p for p in modules()}
    imports = {n: imported(p) for n, p in paths.items()}
    packages = {n for n, p in paths.items() if p.name == "__init__.py"}
    cycles = find_cycles(import_graph(imports, packages))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


MAX_MODULE_LINES = 1000
"""Lines a module of ``analysis`` or ``realrun`` may have: more is a sign that it holds
several things a reader would name apart (benchmarks, fits, report writing...)."""


@pytest.mark.parametrize(
    "path",
    [p for p in modules() if p.relative_to(ROOT).parts[0] in ("analysis", "realrun")],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_analysis_and_realrun_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_MODULE_LINES}): split it "
        "along its seams"
    )
