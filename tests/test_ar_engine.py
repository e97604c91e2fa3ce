"""The AR streaming engine against a naive reference decoder written here."""

from __future__ import annotations

import pytest
import torch

from eval.benchmarks import get_benchmark
from eval.engines.acceptance import AcceptanceRule
from eval.engines.decode import DecodeSpec
from eval.engines.tokens import common_prefix_length
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.models import load_model

MAX_NEW_TOKENS = 24


def naive_greedy(model, prompt_ids: list[int], eos: set[int], max_new_tokens: int) -> list[int]:
    """Reference decoder: the whole sequence re-fed every step, no cache, no drafts."""
    tokens: list[int] = []
    with torch.no_grad():
        while True:
            logits = model(torch.tensor([prompt_ids + tokens])).logits[0, -1]
            tokens.append(int(logits.argmax()))
            if tokens[-1] in eos or len(tokens) >= max_new_tokens:
                return tokens


@pytest.fixture(scope="module")
def humaneval_requests():
    return get_benchmark("humaneval").load(limit=6)


def make_evaluator(model_dir, acceptance="greedy", engine="stepwise", regenerate="plain", **lookup) -> StreamingEvaluator:
    """`lookup`: DecodeSpec's lookup_* settings."""
    decode = DecodeSpec(acceptance=acceptance, engine=engine, max_new_tokens=MAX_NEW_TOKENS, regenerate=regenerate, **lookup)
    config = EvalConfig(model=str(model_dir), decode=decode)
    return StreamingEvaluator(load_model(str(model_dir), device="cpu"), config)


def test_greedy_streaming_is_lossless_and_costs_max_1_L_minus_k(tiny_model_dir, humaneval_requests):
    evaluator = make_evaluator(tiny_model_dir)
    model, eos = evaluator.loaded.model, evaluator.engine.eos_token_ids
    for request in humaneval_requests:
        prompts = evaluator.prompts(request)
        stream = evaluator.engine.stream(prompts)
        baseline = evaluator.engine.baseline(prompts[-1])
        reference_last = naive_greedy(model, prompts[-1], eos, MAX_NEW_TOKENS)
        reference_previous = naive_greedy(model, prompts[-2], eos, MAX_NEW_TOKENS)
        assert baseline.answer == reference_last
        assert stream.final.answer == reference_last, request.request_id
        assert baseline.forwards == len(reference_last)
        k = common_prefix_length(reference_previous, reference_last)
        assert stream.final.forwards == max(1, len(reference_last) - k)
        assert stream.final.draft_length == len(reference_previous)


# The tiny random models are unsure of everything: a low threshold splits their drafts
# into accepted and rejected parts, so the threshold case exercises partial acceptance.
@pytest.mark.parametrize("acceptance", ["greedy", "threshold:0.05"])
def test_fast_path_agrees_with_stepwise_engine_on_every_request(tiny_model_dir, humaneval_requests, acceptance):
    stepwise = make_evaluator(tiny_model_dir, acceptance, engine="stepwise")
    fast = make_evaluator(tiny_model_dir, acceptance, engine="fast")
    compared = ("base_answer", "stream_answer", "draft_tokens", "accepted_tokens", "identical",
                "baseline_forwards", "residual_forwards", "drafting_forwards")
    fast.config.fast_batch_size = 12 if acceptance == "greedy" else 4  # several requests share a padded batch
    assert len(fast.request_groups(humaneval_requests)) > 1
    fast_records = [r for group in fast.request_groups(humaneval_requests) for r in fast.evaluate_many(group)]
    for request, fast_record in zip(humaneval_requests, fast_records):
        slow_record = stepwise.evaluate(request)
        assert {k: slow_record[k] for k in compared} == {k: fast_record[k] for k in compared}, request.request_id
    partial = [0 < r["accepted_tokens"] < r["draft_tokens"] for r in fast_records]
    assert any(partial), "no request accepted part of its draft: the case is not exercised"


def test_verifying_with_a_cropped_cache_matches_verifying_from_scratch(tiny_qwen3_dir, humaneval_requests):
    """Tolerance: 1e-4 absolute on fp32 logits (summation order differs between the two)."""
    evaluator = make_evaluator(tiny_qwen3_dir)
    engine = evaluator.engine
    prompts = evaluator.prompts(humaneval_requests[0])
    draft = engine.baseline(prompts[-2]).answer
    reused = engine.new_state()
    engine.prime(reused, prompts[-2], draft)
    reuse = min(common_prefix_length(reused.cached_ids, prompts[-1] + draft), len(prompts[-1]) - 1)
    assert reuse > 0, "the two prompts share a prefix, so some cache must be reused"
    engine.crop(reused, reuse)
    cropped_logits = engine.forward(reused, (prompts[-1] + draft)[reuse:], None, logits_to_keep=len(draft) + 1)
    scratch_logits = engine.forward(engine.new_state(), prompts[-1] + draft, None, logits_to_keep=len(draft) + 1)
    torch.testing.assert_close(cropped_logits, scratch_logits, atol=1e-4, rtol=0)


def test_threshold_zero_accepts_the_whole_draft(tiny_qwen3_dir, humaneval_requests):
    evaluator = make_evaluator(tiny_qwen3_dir, acceptance="threshold:0")
    for request in humaneval_requests[:3]:
        stream = evaluator.engine.stream(evaluator.prompts(request))
        assert stream.final.accepted == stream.final.draft_length > 0
        assert stream.final.forwards == 1


def test_threshold_one_accepts_nothing_and_costs_the_baseline(tiny_qwen3_dir, humaneval_requests):
    """threshold:1 keeps only tokens of probability exactly 1: none here (asserted
    below), so the verify pass only yields the first answer token
    (PROTOCOL: it doubles as the prefill): L forwards for L tokens, and the
    answer is the greedy one."""
    evaluator = make_evaluator(tiny_qwen3_dir, acceptance="threshold:1")
    for request in humaneval_requests[:3]:
        prompts = evaluator.prompts(request)
        stream = evaluator.engine.stream(prompts)
        baseline = evaluator.engine.baseline(prompts[-1])
        assert stream.final.accepted == 0 and stream.final.draft_length > 0
        assert stream.final.answer == baseline.answer
        assert stream.final.forwards == len(baseline.answer) == baseline.forwards


def test_acceptance_rule_parsing():
    assert AcceptanceRule.parse("greedy").lossless
    assert AcceptanceRule.parse("threshold:0.9").tau == 0.9
    with pytest.raises(ValueError, match="threshold:TAU"):
        AcceptanceRule.parse("threshold:high")
    assert AcceptanceRule.parse("threshold:0").tau == 0 and AcceptanceRule.parse("threshold:1").tau == 1
    # TAU is a probability: -1 used to pass every token (a 32x "speedup"), 1.01 none.
    for spec in ("threshold:-1", "threshold:-0.1", "threshold:1.01", "threshold:nan", "threshold:inf"):
        with pytest.raises(ValueError, match="0 <= TAU <= 1"):
            AcceptanceRule.parse(spec)
    with pytest.raises(ValueError, match="0 <= TAU <= 1"):
        DecodeSpec(acceptance="threshold:-1")


def test_accepted_length_is_the_leading_run():
    logits = torch.full((4, 5), -10.0)
    for position, token in enumerate([1, 2, 0, 3]):
        logits[position, token] = 10.0
    rule = AcceptanceRule.parse("greedy")
    assert rule.accepted_length(logits, [1, 2, 3, 3]) == 2
    assert rule.accepted_length(logits, [1, 2, 0, 3]) == 4
    assert rule.accepted_length(logits, [4, 2, 0, 3]) == 0


@pytest.mark.slow
def test_smollm2_cuts_a_foreign_draft_and_keeps_its_own():
    """The real model keeps its own answer and rejects an answer to another request early."""
    evaluator = make_evaluator("smollm2")
    evaluator.engine.max_new_tokens = 48
    engine, request = evaluator.engine, get_benchmark("humaneval").load(limit=1)[0]
    prompt = evaluator.prompts(request)[-1]
    from headstart.prompts import build_messages, encode_prompt

    foreign_prompt = encode_prompt(evaluator.loaded.tokenizer, build_messages("What is the capital of France?"))
    own_draft = engine.baseline(prompt).answer
    foreign_draft = engine.baseline(foreign_prompt).answer
    for draft, expect_all in ((own_draft, True), (foreign_draft, False)):
        state = engine.new_state()
        state.draft = draft
        result = engine.update(state, prompt, ("verify", "regenerate"))
        if expect_all:
            assert result.accepted == len(draft)
        else:
            assert result.accepted <= 3, evaluator.loaded.tokenizer.decode(draft[: result.accepted])
    assert evaluator.loaded.eos_token_ids
