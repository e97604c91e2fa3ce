"""The pre-PROTOCOL request format, kept only to measure it side by side with
the current one (old vs new format, same model, same problems).

Before the true-prefix rule (PROTOCOL.md, "Requests, segments, replay"),
HumanEval's prompt sat in a ```python fence and MBPP's asserts in a fence that
only the final segment closed, so every partial request ended inside an open
fence. These loaders rebuild exactly those segments, under the request ids and
references of the current loaders, so the same benchmark's `score` applies.
Nothing else may use them: evaluation and training use `headstart.segment`.

    # from a script in benchmarks/ (bench_faster_answers.py)
    from legacy_format import legacy_humaneval_requests, legacy_mbpp_requests
    old = legacy_mbpp_requests("data/mbpp/mbpp.jsonl", limit=40)
"""

from __future__ import annotations

from dataclasses import replace

from eval.benchmarks import Request, get_benchmark
from eval.benchmarks.humaneval import INSTRUCTION
from eval.benchmarks.mbpp import SOURCE
from headstart.benchmark_registry import read_rows
from headstart.segment import segment_code, segment_text

_MBPP_TESTS_INTRO = "Your code should pass these tests:\n```python\n"


def legacy_humaneval_requests(limit: int | None = None) -> list[Request]:
    """HumanEval as it was: the instruction, then the prompt in a fence the last segment closes."""
    requests = get_benchmark("humaneval").load(limit)
    return [replace(r, segments=_legacy_humaneval(r.reference["prompt"])) for r in requests]


def legacy_mbpp_requests(path: str | None = None, limit: int | None = None) -> list[Request]:
    """MBPP as it was: the asserts in a fence opened by the first and closed by the last."""
    rows = {f"mbpp/{row['task_id']}": row for row in read_rows(SOURCE, path)}
    requests = get_benchmark("mbpp", path).load(limit)
    # The original file names the description `text`; the sanitized one `prompt`.
    descriptions = {r.request_id: rows[r.request_id].get("text") or rows[r.request_id].get("prompt") for r in requests}
    return [replace(r, segments=_legacy_mbpp(descriptions[r.request_id], r.reference["tests"])) for r in requests]


def _legacy_humaneval(prompt: str) -> list[str]:
    """The old segmentation of "INSTRUCTION```python\n{prompt}```": the instruction
    by sentence, the prompt by `segment_code`, the fence opening with its first
    segment and closing with its last (every HumanEval prompt ends with a newline)."""
    code = segment_code(prompt)
    code[0] = "```python\n" + code[0]
    code[-1] += "```"
    return segment_text(INSTRUCTION) + code


def _legacy_mbpp(description: str, tests: list[str]) -> list[str]:
    """The old `segment_mbpp`."""
    lines = [test.strip() + "\n" for test in tests]
    lines[0] = _MBPP_TESTS_INTRO + lines[0]
    lines[-1] += "```"
    return segment_text(description.strip() + "\n") + lines
