"""MBPP (test split: task ids 11-510, `headstart.benchmark_registry`), pass@1 on the task's test asserts."""

from __future__ import annotations

import re
from typing import Any

from eval.benchmarks.base import Request, Score, streamable
from eval.benchmarks.sources import DATA, read_rows, require_fields
from eval.extract import extract_code
from eval.sandbox import SandboxLimits, run_tests
from headstart.segment import segment_mbpp

# The test split (hub id, config, task ids 11-510): the rows the decontamination filter indexes.
# The sanitized file (`mbpp_sanitized_test`) numbers its tasks the same way.
SOURCE = DATA["mbpp_test"]


def entry_point(tests: list[str]) -> str | None:
    """The function the asserts call first (`assert name(`)."""
    match = re.search(r"assert\s+\(?\s*([A-Za-z_]\w*)\s*\(", tests[0]) if tests else None
    return match.group(1) if match else None


class MBPP:
    """Description sentences, then the asserts one by one; scored by running them."""

    name = "mbpp"

    def __init__(self, path: str | None = None, limits: SandboxLimits = SandboxLimits()) -> None:
        self.path = path
        self.limits = limits

    def load(self, limit: int | None = None) -> list[Request]:
        rows = read_rows(self.path, SOURCE)
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
        ref = request.reference
        code = extract_code(answer, ref["entry_point"])
        program = "\n".join([ref["setup"], code, "", *ref["tests"]]) + "\n"
        result = run_tests(program, self.limits)
        return Score(value=float(result.passed), passed=result.passed, detail=result.status)
