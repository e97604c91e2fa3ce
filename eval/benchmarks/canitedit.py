"""CanItEdit (105 instructed code edits), pass@1 on the hidden tests."""

from __future__ import annotations

from typing import Any

from eval.benchmarks.base import Request, Score, execution_score, streamable
from eval.benchmarks.extract import extract_code
from eval.benchmarks.imports import missing_modules, skipped_detail
from eval.sandbox import SandboxLimits, run_tests
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.segment import segment_edit_request

SOURCE = DATA["canitedit"]


class CanItEdit:
    """The program (cut at top-level statements), then the instruction's sentences."""

    name = "canitedit"

    def __init__(self, path: str | None = None, limits: SandboxLimits = SandboxLimits(),
                 instruction: str = "descriptive") -> None:
        if instruction not in ("descriptive", "lazy"):
            raise ValueError(f"CanItEdit instruction must be 'descriptive' or 'lazy', not {instruction!r}")
        self.path = path
        self.limits = limits
        self.instruction = f"instruction_{instruction}"

    def load(self, limit: int | None = None) -> list[Request]:
        """CanItEdit's streamable requests, by problem id.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        rows = read_rows(SOURCE, self.path)
        require_fields(rows, SOURCE.schema, f"CanItEdit {self.path or SOURCE.hub_id}")
        requests = streamable([self._request(row) for row in sorted(rows, key=lambda r: int(r["id"]))])
        return requests[:limit] if limit is not None else requests

    def _request(self, row: dict[str, Any]) -> Request:
        name = row.get("full_name") or f"{row['id']}_{row.get('name', '')}"
        reference = {"tests": row["tests"], "before": row["before"]}
        return Request(f"canitedit/{name}", segment_edit_request(row["before"], row[self.instruction]),
                       reference=reference)

    def score(self, request: Request, answer: str) -> Score:
        """Pass when the edited program passes the problem's tests; skipped when they need a missing library.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        # A problem whose program or tests import a missing library is skipped.
        missing = missing_modules(request.reference["before"], request.reference["tests"])
        if missing:
            return Score(value=0.0, passed=None, detail=skipped_detail(missing))
        # The edited program is the whole answer's code; the tests follow it.
        program = f"{extract_code(answer)}\n\n{request.reference['tests']}\n"
        # In the program's process (the tests use its classes and state): see eval/sandbox/.
        return execution_score(run_tests(program, self.limits))
