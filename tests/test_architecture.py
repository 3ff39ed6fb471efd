"""The layout rules of docs/architecture.md, checked on the source: no module in planner/ over
MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES, no import circle between planner's
modules (imports inside functions count: they are circles deferred, not removed), and no
private name (`_x`) imported from another module, in planner/ or in the tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "planner"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 100


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, tree: ast.AST):
    """(module imported from, names) for each `from ... import ...` in the file, relative
    imports resolved against the file's package."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [a.name for a in node.names]


def _sources(folder: Path):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_no_module_or_function_too_long():
    long = []
    for path, tree in _sources(PACKAGE):
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {n} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert long == []


def test_no_import_circle():
    graph: dict[str, set[str]] = {}
    for path, tree in _sources(PACKAGE):
        graph[_module_name(path)] = {t for t, _ in _imports(path, tree) if t.startswith("planner")}
    graph = {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}
    # Tarjan's strongly connected components: a component of more than one module is a circle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_private_name_imported_across_modules():
    found = []
    for folder in (PACKAGE, ROOT / "tests"):
        for path, tree in _sources(folder):
            for target, names in _imports(path, tree):
                for name in names:
                    if name.startswith("_") and not name.startswith("__"):
                        found.append(f"{path.relative_to(ROOT)}: from {target} import {name}")
    assert found == []


def test_the_checks_see_what_they_check():
    """Not vacuous: the package has its modules, functions and imports where the checks look."""
    modules = list(_sources(PACKAGE))
    assert len(modules) > 50
    assert any(t == "planner.cost.compute" for p, tree in modules for t, _ in _imports(p, tree))
    assert max(len(p.read_text().splitlines()) for p, _ in modules) > MAX_MODULE_LINES // 2
