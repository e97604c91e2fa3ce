"""MBPP (test split: task ids 11-510, `headstart.benchmark_registry`), pass@1 on the task's test asserts."""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any

from eval.benchmarks.base import Request, Score, execution_score, streamable
from eval.benchmarks.extract import extract_code
from eval.sandbox import SandboxLimits, TrustedTests, run_calls, run_tests
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.segment import segment_mbpp

# The test split (hub id, config, task ids 11-510): the rows the decontamination filter indexes.
# The sanitized file (`mbpp_sanitized_test`) numbers its tasks the same way.
SOURCE = DATA["mbpp_test"]


def entry_point(tests: list[str]) -> str | None:
    """The function the asserts call first (`assert name(`).

    Args:
        tests (list[str]): the assert lines.
    """
    match = re.search(r"assert\s+\(?\s*([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
    return match.group(1) if match else None


def program_names(tests: list[str], setup: str, entry: str | None) -> tuple[str, ...] | None:
    """The program's functions and classes the setup and the asserts call (the entry point, and
    any other name neither they nor the builtins define), when the tests can run apart from the
    program: every such name is only ever called (what a class builds stays in the program's
    process, a handle on the trusted side: task 367's trees). None when they cannot.

    Args:
        tests (list[str]): the assert lines.
        setup (str): the problem's setup code.
        entry (str | None): the entry point, or None.
    """
    try:
        tree = ast.parse(setup + "\n" + "\n".join(tests))
    except SyntaxError:
        return None
    names = (_loaded(tree) - _bound(tree) - set(dir(builtins))) | ({entry} if entry else set())
    loads = sorted(node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id in names)
    calls = sorted(node.func.id for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names)
    return tuple(sorted(names)) if names and loads == calls else None


def _loaded(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _bound(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


class MBPP:
    """Description sentences, then the asserts one by one; scored by running them."""

    name = "mbpp"

    def __init__(self, path: str | None = None, limits: SandboxLimits = SandboxLimits()) -> None:
        self.path = path
        self.limits = limits

    def load(self, limit: int | None = None) -> list[Request]:
        """MBPP's streamable requests of the selected split, by task id.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        rows = read_rows(SOURCE, self.path)
        require_fields(rows, SOURCE.schema, f"MBPP {self.path or SOURCE.hub_id}")
        requests = [self._request(row) for row in rows if SOURCE.keeps(row)]
        requests = streamable(sorted(requests, key=lambda r: int(r.request_id.split("/")[1])))
        return requests[:limit] if limit is not None else requests

    def _request(self, row: dict[str, Any]) -> Request:
        # The original file names the description `text`; the sanitized one `prompt`.
        description = row.get("text") or row.get("prompt")
        if description is None:
            raise ValueError(f"MBPP task {row['task_id']} has neither 'text' nor 'prompt'")
        setup = row.get("test_setup_code", "") or "\n".join(row.get("test_imports", []))
        reference = {"tests": list(row["test_list"]), "setup": setup, "entry_point": entry_point(row["test_list"])}
        return Request(f"mbpp/{row['task_id']}", segment_mbpp(description, row["test_list"]), reference=reference)

    def score(self, request: Request, answer: str) -> Score:
        """Pass when the asserts pass against the answer's code.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        ref = request.reference
        code = extract_code(answer, ref["entry_point"])
        names = program_names(ref["tests"], ref["setup"], ref["entry_point"])
        if names is None:  # the tests need the program's objects (its setup builds them): in its process
            return execution_score(run_tests("\n".join([code, "", ref["setup"], *ref["tests"]]) + "\n", self.limits))
        # The setup and the asserts run in a trusted process; the program only answers calls. A setup
        # that calls the program (task 367 builds its trees) comes after it, as officially: the
        # program alone serves; any other goes first too (its imports, which programs may rely on).
        job = TrustedTests(prelude="", body="\n".join([ref["setup"], *ref["tests"]]) + "\n", proxies=names)
        calls_program = bool(set(names) & _loaded(ast.parse(ref["setup"])))
        program = code if calls_program else "\n".join([ref["setup"], code])
        return execution_score(run_calls(program + "\n", job, self.limits))
