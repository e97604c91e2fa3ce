"""DS-1000 (1000 data-science problems, seven libraries), with the official
postprocessing and execution: code_context + solution + test_execution.

A problem whose libraries are not installed here is scored as skipped (counted
in the summary, left out of quality), never as a pass or a fail. The official
harness pins library versions (the `ds1000` extra); other versions may fail
some reference solutions, so report the versions with the numbers."""

from __future__ import annotations

from typing import Any

from eval.benchmarks.base import Request, Score, execution_score, streamable
from eval.benchmarks.extract import ds1000_postprocess
from eval.benchmarks.imports import missing_modules, skipped_detail
from eval.sandbox import SandboxLimits, run_tests
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.segment import segment_ds1000

SOURCE = DATA["ds1000"]
# The official harness's time per problem (`wall_seconds`); importing torch or TensorFlow
# maps several GB of address space, hence the larger memory limit.
DS1000_LIMITS = SandboxLimits(cpu_seconds=60, wall_seconds=120, memory_bytes=16 << 30, max_processes=64)
LIBRARY_MODULES = {
    "Pandas": "pandas", "Numpy": "numpy", "Matplotlib": "matplotlib", "Sklearn": "sklearn",
    "Scipy": "scipy", "Pytorch": "torch", "Tensorflow": "tensorflow",
}


def test_program(code_context: str, code: str) -> str:
    """The official test program for one solution.

    Args:
        code_context (str): the problem's test context.
        code (str): the solution.
    """
    program = f"{code_context}\ncode = {code!r}\ntest_execution(code)\n"
    return program + ("test_string(code)\n" if "test_string(" in code_context else "\n")


class DS1000:
    """The official prompt, streamed by sentence and line, each `<code>` block whole; official execution."""

    name = "ds1000"

    def __init__(self, path: str | None = None, limits: SandboxLimits = DS1000_LIMITS) -> None:
        self.path = path
        self.limits = limits

    def load(self, limit: int | None = None) -> list[Request]:
        """DS-1000's streamable requests, by problem id.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        rows = read_rows(SOURCE, self.path)
        require_fields(rows, SOURCE.schema, f"DS-1000 {self.path or SOURCE.hub_id}")
        rows = sorted(rows, key=lambda r: int(r["metadata"]["problem_id"]))
        requests = streamable([self._request(row) for row in rows])
        return requests[:limit] if limit is not None else requests

    def _request(self, row: dict[str, Any]) -> Request:
        meta = row["metadata"]
        reference = {"code_context": row["code_context"], "library": meta["library"],
                     "reference_code": row.get("reference_code", "")}
        return Request(f"ds1000/{meta['problem_id']}", segment_ds1000(row["prompt"]), reference=reference)

    def missing_modules(self, request: Request) -> list[str]:
        """The problem's library and every module its test program imports.

        Args:
            request (Request): the problem's request.
        """
        ref = request.reference
        library = LIBRARY_MODULES.get(ref["library"], ref["library"].lower())
        return missing_modules(ref["code_context"], extra=(library,))

    def score(self, request: Request, answer: str) -> Score:
        """Pass when the official test program passes; skipped when it needs a missing library.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        missing = self.missing_modules(request)
        if missing:
            return Score(value=0.0, passed=None, detail=skipped_detail(missing))
        program = test_program(request.reference["code_context"], ds1000_postprocess(answer))
        # In the program's process (the official tests take its namespace whole): see eval/sandbox/.
        return execution_score(run_tests(program, self.limits))
