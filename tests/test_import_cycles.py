"""No module of the package imports, directly or through others, a module that imports it back.

Imports are read from the sources (those inside functions and under ``TYPE_CHECKING`` too: a
type-only cycle still ties two modules' designs together), so the test needs no import to run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tropical

PACKAGE = Path(tropical.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, modules: set[str]) -> Iterator[str]:
    """The package's modules that ``path`` (module ``name``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target not in (name, "tropical"):
                yield target


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: set(imported(path, name, set(files))) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_module_imports_itself_back() -> None:
    graph = import_graph()
    assert len(graph) > 100
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


PURE = ("tropical.core", "tropical.sched")
"""The layers DESIGN.md keeps pure: no I/O, no torch, no wall clock."""
ABOVE = ("tropical.sim", "tropical.serve", "tropical.engine", "tropical.bench", "tropical.fidelity",
         "tropical.report", "tropical.cli")
"""Layers built on them: a pure module importing one of these would be an arrow running upward."""


def test_no_arrow_runs_upward_from_the_pure_layers() -> None:
    graph = import_graph()
    upward = sorted((module, target) for module, targets in graph.items() if module.startswith(PURE)
                    for target in targets if target.startswith(ABOVE))
    assert upward == []
    assert any(m.startswith("tropical.sched") for m in graph), "the pure layers were not read"
