"""Which modules a test program needs, and which of them are not installed here.
A problem that needs a missing module is scored as skipped, never as a fail
(which would blame the model) nor as a pass."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache


def imported_modules(source: str) -> set[str]:
    """Top-level names of every absolute import in `source` (none if it does not parse).

    Args:
        source (str): Python source.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module.split(".")[0])
    return modules


@cache
def installed(module: str) -> bool:
    """Whether `module` can be imported here.

    Args:
        module (str): a top-level module's name.
    """
    return importlib.util.find_spec(module) is not None


def missing_modules(*sources: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Modules imported by `sources` (plus `extra`) that cannot be found, sorted.

    Args:
        sources (str): Python sources.
        extra (tuple[str, ...]): modules needed besides those imported.
    """
    needed = set(extra).union(*(imported_modules(s) for s in sources))
    return sorted(m for m in needed if not installed(m))


def skipped_detail(missing: list[str]) -> str:
    """The detail of a score skipped for missing modules.

    Args:
        missing (list[str]): the modules that are not installed.
    """
    return f"skipped: {', '.join(missing)} not installed"
