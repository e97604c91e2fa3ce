"""The code's shape: no import cycle in any package (headstart, eval, train, data_builders) nor among
the scripts (benchmarks/, scripts/); no test-only code in them; no function longer than
LONGEST_FUNCTION lines (its docstring included); each shared setting declared once.

The graph is read from the source with `ast`: every import counts, at a module's top, under
`if TYPE_CHECKING:` and inside a function alike, since a cycle hidden behind a TYPE_CHECKING
import or a deferred one is still two modules that each need the other's names. Shared types
live in a module that imports neither side.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


PACKAGES = ("headstart", "eval", "train", "data_builders")
SCRIPT_FOLDERS = ("benchmarks", "scripts")


def dotted(path: Path, root: Path) -> str:
    """The module name of `path` under `root` (a package's `__init__` is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files() -> dict[str, Path]:
    """Dotted name -> file of every module of the packages, and of the scripts both by their path
    from the repository and from their folder (a script imports those beside it, and the packages
    among them, by the shorter name: the folder is on its sys.path)."""
    modules = {}
    for package in PACKAGES:
        modules |= {dotted(path, REPO): path for path in sorted((REPO / package).rglob("*.py"))}
    for folder in SCRIPT_FOLDERS:
        for path in sorted((REPO / folder).rglob("*.py")):
            modules[dotted(path, REPO / folder)] = path
            modules[dotted(path, REPO)] = path
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
    """Module -> the modules it imports; a script's two names are one node (its dotted path)."""
    modules = module_files()
    node = {path: name for name, path in modules.items()}  # the dotted path: inserted last
    return {node[path]: {node[modules[m]] for m in imported_modules(path, modules)} - {node[path]}
            for path in set(modules.values())}


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


def test_no_package_and_no_script_has_an_import_cycle():
    graph = import_graph()
    covered = ("eval.engines.decode", "train.sft_config", "data_builders.build", "headstart.config",
               "benchmarks.study_adaptation", "scripts.device_check")
    assert all(name in graph for name in covered), sorted(set(covered) - set(graph))  # every tree is read
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


SOURCE_FOLDERS = PACKAGES + SCRIPT_FOLDERS


def source_files() -> list[Path]:
    return [path for folder in SOURCE_FOLDERS for path in sorted((REPO / folder).rglob("*.py"))]


def test_nothing_outside_the_tests_reaches_into_them():
    """The tests' support code is theirs alone: no package, benchmark or script imports it or
    puts tests/ on its path (what both need lives outside tests/: scripts/device_check/tiny_models.py,
    benchmarks/synthetic_corpus.py)."""
    reaching = [str(path.relative_to(REPO)) for path in source_files()
                if re.search(r"tests[/.]support|/ \"tests\"", path.read_text())]
    assert reaching == []


def test_every_public_function_and_class_of_the_packages_is_used_outside_the_tests():
    """A package ships no code only the tests call: each top-level public function and class is
    named somewhere in the packages, benchmarks or scripts besides its own definition."""
    texts = [path.read_text() for path in source_files()]
    counts = Counter(word for text in texts for word in re.findall(r"[A-Za-z_]\w*", text))
    unused = []
    for path, text in zip(source_files(), texts):
        if path.relative_to(REPO).parts[0] in SCRIPT_FOLDERS:
            continue
        for node in ast.parse(text).body:
            named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if named and not node.name.startswith("_") and counts[node.name] < 2:
                unused.append(f"{path.relative_to(REPO)}: {node.name}")
    assert unused == []


LONGEST_FUNCTION = 60


def test_no_function_is_longer_than_sixty_lines():
    long = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert long == []


# The settings many commands share, each declared by one dataclass field (headstart/run_config.py) that
# every schema holding it composes: one name, one default, one help.
SHARED_SETTINGS = ("device", "dtype", "adapter", "system_prompt", "prompt_format")


def schema_fields() -> dict[str, list[str]]:
    """Field name -> `file:Class` of every dataclass field declared with `field(...)` in the packages
    and scripts (the settings schemas declare theirs so, with a help)."""
    declared: dict[str, list[str]] = {}
    for path in module_files().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and isinstance(item.value, ast.Call) and getattr(item.value.func, "id", "") == "field"):
                    declared.setdefault(item.target.id, []).append(f"{path.relative_to(REPO)}:{node.name}")
    return declared


def test_each_shared_setting_is_declared_once():
    declared = schema_fields()
    again = {name: sorted(set(declared[name])) for name in SHARED_SETTINGS if len(set(declared.get(name, []))) != 1}
    assert not again, f"declared more than once (compose headstart/run_config.py's): {again}"
    assert {name: declared[name] for name in SHARED_SETTINGS} == {
        name: ["headstart/run_config.py:" + cls] for name, cls in zip(SHARED_SETTINGS, (
            "DeviceSetting", "DtypeSetting", "AdapterSetting", "SystemPromptSetting", "PromptFormatSetting"))}
