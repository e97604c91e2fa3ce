"""No import cycles in eval/ or among the studies (benchmarks/study_*.py).

The graph is read from the source with `ast`: every import counts, at a module's top, under
`if TYPE_CHECKING:` and inside a function alike, since a cycle hidden behind a TYPE_CHECKING
import or a deferred one is still two modules that each need the other's names. Shared types
live in a module that imports neither side.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def module_files() -> dict[str, Path]:
    """Dotted name -> file of every module of eval/, and the studies by their script names
    (they import each other as scripts beside each other)."""
    modules = {}
    for path in sorted((REPO / "eval").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((REPO / "benchmarks").glob("study_*.py")):
        modules[path.stem] = path
    return modules


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of `modules` that `path` imports anywhere in its text (a name imported from a
    package counts as its submodule when there is one, else as the package)."""
    found = set()

    def add(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_type_checking_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eval.x import Y\n"
                      "def f():\n    import eval.z\n")
    assert imported_modules(source, {"eval.x": source, "eval.z": source, "eval": source}) == {"eval.x", "eval.z"}


def test_eval_and_the_studies_have_no_import_cycles():
    graph = import_graph()
    assert "eval.engines.decode" in graph and "study_adaptation" in graph  # the graph covers both trees
    assert cycles(graph) == []


def test_nothing_outside_the_sandbox_imports_its_private_names():
    """eval/sandbox/ is one public API (its __init__); its modules' private names stay inside it."""
    sandbox = REPO / "eval" / "sandbox"
    files = [p for folder in ("eval", "benchmarks", "scripts", "tests") for p in (REPO / folder).rglob("*.py")
             if sandbox not in p.parents]
    private = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("eval.sandbox"):
                private += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []
