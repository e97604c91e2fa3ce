"""The ReFusion engine against a naive plan-and-infill decoder written here, its
streaming update, and the runner end to end with engine=refusion."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import replace

import pytest
import torch

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.refusion_decoding import RefusionEngine
from eval.engines.tokens import common_prefix_length
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from eval.evaluation.runner import run_evaluation
from headstart.files import read_jsonl
from headstart.models import load_model
from headstart.refusion import mask_token_id

MAX_NEW_TOKENS = 24


class NaiveRefusion:
    """Reference decoder: the same algorithm written plainly. No KV cache: every
    forward recomputes the whole fed sequence (prompt, then committed tokens in
    commit order, then what the step feeds) with explicit position ids. It counts
    which branch each step takes."""

    def __init__(self, model, mask_id: int, eos: set[int], max_new_tokens: int, settings: DecodeSpec) -> None:
        self.model, self.mask_id, self.eos, self.max_new_tokens = model, mask_id, eos, max_new_tokens
        self.size, self.settings = settings.slot_size, settings
        self.forwards = 0
        self.branches: Counter[str] = Counter()

    def probabilities(self, rows: list[list[tuple[int, int]]]) -> torch.Tensor:
        """One model call over equal-length rows of (token, position)."""
        self.forwards += 1
        tokens = torch.tensor([[t for t, _ in row] for row in rows])
        positions = torch.tensor([[p for _, p in row] for row in rows])
        with torch.no_grad():
            # An explicit (all-ones) mask: causal attention over the fed order, and
            # no reading of position gaps as packed sequences.
            logits = self.model(input_ids=tokens, position_ids=positions, attention_mask=torch.ones_like(tokens)).logits
        return torch.softmax(logits.float(), dim=-1)

    def decode(self, prompt: list[int], prefix: list[int] = ()) -> list[int]:
        """The answer's tokens after `prefix` (an accepted draft prefix, already known)."""
        size, settings = self.size, self.settings
        context = [(t, p) for p, t in enumerate(list(prompt) + list(prefix))]
        start, length = len(context), self.max_new_tokens - len(prefix)
        slots = [start + size * k for k in range(math.ceil(length / size))]
        # Blocks keep the width they have in a full buffer.
        full_slots = math.ceil(self.max_new_tokens / size)
        block = math.ceil(full_slots / min(settings.serial_blocks, full_slots))
        eos_position = None
        for block_start in range(0, len(slots), block):
            undecided = slots[block_start : block_start + block]
            while undecided:
                # 1. plan
                masks = [(self.mask_id, s + j) for s in undecided for j in range(size)]
                probs = self.probabilities([context + masks])[0, len(context) :]
                confidence, x0 = probs.max(dim=-1)
                picked = [i for i in range(len(undecided)) if confidence[i * size] > settings.slot_threshold]
                picked = picked or [int(confidence[::size].argmax())]
                chosen = [undecided[i] for i in picked]
                self.branches["several slots chosen"] += len(chosen) > 1
                drafts = [x0[i * size : (i + 1) * size].tolist() for i in picked]
                # 2. verify the concatenation
                flat = [(t, s + j) for s, d in zip(chosen, drafts) for j, t in enumerate(d)]
                probs = self.probabilities([context + flat])[0]
                passes = [j % size == 0 or float(probs[len(context) + j - 1, t]) > settings.token_threshold
                          for j, (t, _) in enumerate(flat)]
                run = passes.index(False) if False in passes else len(passes)
                eos_at = next((j for j in range(run) if flat[j][0] in self.eos), None)
                if eos_at is not None or run >= size:
                    keep = eos_at + 1 if eos_at is not None else run - run % size
                    self.branches["eos in verify" if eos_at is not None else "whole slots"] += 1
                    context += flat[:keep]
                    done = chosen[: math.ceil(keep / size)]
                else:
                    # 3. infill each chosen slot in its own row
                    self.branches["infill"] += 1
                    accepted = [passes[i * size : (i + 1) * size] for i in range(len(chosen))]
                    accepted = [a.index(False) if False in a else size for a in accepted]
                    rows = self.cut_at_eos(drafts, accepted)
                    while any(a < size for a in accepted[: len(rows)]):
                        self.branches["infill round"] += 1
                        live = [i for i in range(len(rows)) if accepted[i] < size]
                        feed = [context + [(rows[i][j] if j < accepted[i] else self.mask_id, chosen[i] + j) for j in range(size)]
                                for i in live]
                        predicted = self.probabilities(feed)[:, len(context) :].argmax(dim=-1)
                        for r, i in enumerate(live):
                            rows[i][accepted[i] :] = predicted[r, accepted[i] :].tolist()
                        feed = [context + [(rows[i][j], chosen[i] + j) for j in range(size)] for i in live]
                        probs = self.probabilities(feed)[:, len(context) :]
                        for r, i in enumerate(live):
                            a = accepted[i] + 1
                            while a < size and float(probs[r, a - 1, rows[i][a]]) > settings.token_threshold:
                                a += 1
                            accepted[i] = a
                        rows = self.cut_at_eos(rows, accepted)
                    for row, s in zip(rows, chosen):
                        context += [(t, s + j) for j, t in enumerate(row)]
                    done = chosen
                for t, p in context[start:]:
                    if t in self.eos and (eos_position is None or p < eos_position):
                        eos_position = p
                undecided = [s for s in undecided if s not in done and (eos_position is None or s < eos_position)]
            if eos_position is not None:
                self.branches["eos stop"] += 1
                break
        answer = [t for _, t in sorted((p, t) for t, p in context[start:])][:length]
        cut = next((j for j, t in enumerate(answer) if t in self.eos), None)
        return answer if cut is None else answer[: cut + 1]

    def cut_at_eos(self, rows: list[list[int]], accepted: list[int]) -> list[list[int]]:
        rows = [list(r) for r in rows]
        for i in range(len(rows)):
            eos_at = next((j for j in range(accepted[i]) if rows[i][j] in self.eos), None)
            if eos_at is not None:
                self.branches["eos in infill"] += 1
                accepted[i] = self.size
                return rows[:i] + [rows[i][: eos_at + 1]]
        return rows


# The seeded toy's probabilities are extremely peaked (conftest scales its output
# layer): a drafted token is either the causal choice (p near 1) or astronomically
# unlikely. A token threshold of 1e-5 lets some of them through, so whole-slot
# commits, infill rounds of different lengths and multi-slot plans all occur.
# NaiveRefusion feeds infilled tokens again as causal context (infill_kv=refeed); the default splice is held
# to an independent implementation of upstream's generate in tests/test_refusion_upstream.py. A draft is
# judged with its EOS (draft_end=verify) unless a test says otherwise.
TOY_SETTINGS = DecodeSpec(engine="refusion", regenerate="plain", max_new_tokens=MAX_NEW_TOKENS, slot_size=4,
                          serial_blocks=2, slot_threshold=0.5, token_threshold=1e-5, infill_kv="refeed",
                          draft_end="verify")
# A token the seeded toy often produces stands in for EOS, so that answers end early.
TOY_EOS = 119
PHASES = ("verify", "regenerate")


@pytest.fixture(scope="module")
def toy(tiny_refusion_dir):
    config = EvalConfig(model=str(tiny_refusion_dir), decode=TOY_SETTINGS)
    evaluator = StreamingEvaluator(load_model(str(tiny_refusion_dir), device="cpu"), config)
    # Five requests: with fewer, the seeded toy may keep no draft only in part (a case the tests need).
    prompts = [evaluator.prompts(request) for request in get_benchmark("humaneval").load(limit=5)]
    return evaluator.loaded, prompts


def toy_engine(loaded, acceptance: str = "greedy", settings: DecodeSpec = TOY_SETTINGS) -> RefusionEngine:
    mask = mask_token_id(loaded.tokenizer)
    return RefusionEngine(loaded.model, mask, {TOY_EOS}, replace(settings, acceptance=acceptance))


def toy_reference(loaded) -> NaiveRefusion:
    return NaiveRefusion(loaded.model, mask_token_id(loaded.tokenizer), {TOY_EOS}, MAX_NEW_TOKENS, TOY_SETTINGS)


def test_decoder_matches_the_naive_reference_in_answer_and_forwards(toy):
    loaded, prompts = toy
    engine, reference = toy_engine(loaded), toy_reference(loaded)
    for request_prompts in prompts:
        before = reference.forwards
        expected = reference.decode(request_prompts[-1])
        result = engine.baseline(request_prompts[-1])
        assert result.answer == expected
        assert result.forwards == reference.forwards - before
    branches = reference.branches
    for branch in ("whole slots", "infill", "eos stop", "several slots chosen", "eos in infill"):
        assert branches[branch] > 0, f"the toy never took the {branch!r} branch: {dict(branches)}"
    # Some infill ended before slot_size - 1 rounds: accepted prefixes grew by whole runs.
    assert branches["infill round"] < branches["infill"] * (TOY_SETTINGS.slot_size - 1)


def test_a_partially_accepted_draft_is_infilled_after_its_accepted_prefix(toy):
    loaded, prompts = toy
    engine, reference = toy_engine(loaded), toy_reference(loaded)
    prompt = prompts[0][-1]
    greedy: list[int] = []  # the causal greedy continuation passes the greedy rule
    for _ in range(6):
        greedy.append(int(reference.probabilities([[(t, p) for p, t in enumerate(prompt + greedy)]])[0, -1].argmax()))
    assert TOY_EOS not in greedy
    state = engine.new_state()
    state.draft = greedy[:5] + [(greedy[5] + 1) % len(loaded.tokenizer)] * 2  # token 5 is not the argmax
    result = engine.update(state, prompt, PHASES)
    before = reference.forwards
    assert result.accepted == 5
    assert result.answer == greedy[:5] + reference.decode(prompt, greedy[:5])
    assert result.forwards == 1 + reference.forwards - before  # the verification pass, then the reference's decode


def test_streaming_with_an_empty_draft_is_the_baseline(toy):
    loaded, prompts = toy
    engine = toy_engine(loaded)
    for request_prompts in prompts:
        baseline = engine.baseline(request_prompts[-1])
        streamed = engine.stream(request_prompts[-1:]).final
        assert (streamed.answer, streamed.forwards) == (baseline.answer, baseline.forwards)
        assert streamed.draft_length == streamed.accepted == 0


def test_a_fully_accepted_draft_costs_the_minimum_and_a_rejected_one_the_baseline_plus_one(toy):
    """threshold:0 passes every token: the toy's own answer is not its causal greedy
    answer, so the greedy rule could reject it (a trained ReFusion keeps its own)."""
    loaded, prompts = toy
    accept_all, reject_all = toy_engine(loaded, "threshold:0"), toy_engine(loaded, "threshold:1")
    ended_with_eos = 0
    for request_prompts in prompts:
        prompt = request_prompts[-1]
        baseline = accept_all.baseline(prompt)
        ended_with_eos += baseline.answer[-1] == TOY_EOS
        state = accept_all.new_state()
        state.draft = baseline.answer
        result = accept_all.update(state, prompt, PHASES)
        assert result.answer == baseline.answer and result.accepted == len(baseline.answer)
        assert result.forwards == accept_all.min_residual_forwards == 1
        state = reject_all.new_state()
        state.draft = baseline.answer
        result = reject_all.update(state, prompt, PHASES)
        assert result.accepted == 0
        assert result.answer == baseline.answer and result.forwards == baseline.forwards + 1
    assert ended_with_eos > 0


def test_the_answer_end_is_decoded_as_the_paper_counts_refusion(toy):
    """draft_end=decode: a fully accepted draft is judged without its EOS, and the end is decoded by a
    plan and a verify forward: 3 residual forwards at least (the paper's floor on ReFusion-8B)."""
    loaded, prompts = toy
    settings = replace(TOY_SETTINGS, draft_end="decode")
    accept_all, reference = toy_engine(loaded, "threshold:0", settings), toy_reference(loaded)
    assert accept_all.min_residual_forwards == 3
    at_floor = 0
    for request_prompts in prompts:
        prompt = request_prompts[-1]
        baseline = accept_all.baseline(prompt)
        if baseline.answer[-1] != TOY_EOS:
            continue
        state = accept_all.new_state()
        state.draft = baseline.answer
        result = accept_all.update(state, prompt, PHASES)
        text = baseline.answer[:-1]
        assert result.accepted == result.draft_length == len(text)
        before = reference.forwards
        assert result.answer == text + reference.decode(prompt, text)
        assert result.forwards == 1 + reference.forwards - before >= 3
        at_floor += result.forwards == 3
    assert at_floor > 0


def test_draft_in_context_decodes_after_the_prompt_and_the_draft(toy):
    """The draft-refinement layout (train/refusion_objective.py): prompt | draft without its EOS |
    answer, while the answer is decoded. The verification pass judges the draft after the prompt
    alone: no position that judges a draft token can see that token. An empty draft is the baseline."""
    loaded, prompts = toy
    refining = replace(TOY_SETTINGS, draft_in_context=True)
    plain, reference = toy_engine(loaded), toy_reference(loaded)
    stripped_eos = partial = 0
    for request_prompts in prompts:
        previous, prompt = request_prompts[-2], request_prompts[-1]
        draft = plain.baseline(previous).answer
        context = prompt + (draft[:-1] if draft[-1] == TOY_EOS else draft)
        stripped_eos += draft[-1] == TOY_EOS
        for acceptance in ("threshold:1", "greedy", "threshold:0.00001"):
            engine, without_context = toy_engine(loaded, acceptance, refining), toy_engine(loaded, acceptance)
            state = engine.new_state()
            state.draft = draft
            result = engine.update(state, prompt, PHASES)
            # The same verdicts as an engine that never puts the draft in context.
            assert result.accepted == without_context.rule.accepted_length(
                without_context.verify_draft(without_context.new_state(), prompt, draft, None), draft)
            kept = draft[: result.accepted]
            before = reference.forwards
            if engine.finished(kept):  # the whole draft, its EOS included: nothing left to decode
                assert (result.answer, result.forwards) == (kept, 1)
            else:
                assert result.answer == kept + reference.decode(context, kept)
                assert result.forwards == 1 + reference.forwards - before
            if acceptance == "threshold:1":  # no draft token has probability exactly 1 here: nothing kept
                assert result.accepted == 0
            partial += 0 < result.accepted < len(draft)
        baseline = toy_engine(loaded, settings=refining).baseline(prompt)
        assert (baseline.answer, baseline.forwards) == (plain.baseline(prompt).answer, plain.baseline(prompt).forwards)
    assert stripped_eos > 0 and partial > 0


def test_the_default_decoder_streams_as_a_fresh_decode_after_the_kept_prefix(toy):
    """infill_kv=splice and draft_end=decode (the defaults), the draft in context or not: after a whole
    replay (its caches hold spliced infill KV), the final update's answer is the kept prefix plus what a
    decoder with an empty cache decodes after it, in as many forwards plus the verify pass. Reusing the
    verify pass's cache, and never the spliced entries, changes nothing."""
    loaded, prompts = toy
    partial = 0
    for draft_in_context in (False, True):
        settings = replace(TOY_SETTINGS, infill_kv="splice", draft_end="decode", draft_in_context=draft_in_context)
        for acceptance in ("greedy", "threshold:0.00001"):
            engine, fresh = toy_engine(loaded, acceptance, settings), toy_engine(loaded, acceptance, settings)
            for request_prompts in prompts:
                state = engine.new_state()
                for prompt in request_prompts[:-1]:
                    engine.update(state, prompt, ("drafting", "drafting"))
                held, prompt = list(state.draft), request_prompts[-1]
                result = engine.update(state, prompt, PHASES)
                judged = held[:-1] if held and held[-1] == TOY_EOS else held
                kept = judged[: result.accepted]
                context = prompt + (judged if draft_in_context else [])
                before = sum(fresh.forwards.values())
                assert result.answer == kept + fresh.decode(fresh.new_state(), context, kept, "regenerate")
                assert result.forwards == (1 if judged else 0) + sum(fresh.forwards.values()) - before
                partial += 0 < result.accepted < len(judged)
    assert partial > 0


def test_verifying_with_a_reused_cache_matches_verifying_from_scratch(toy):
    """Tolerance: 1e-4 absolute on fp32 logits (summation order differs between the two)."""
    loaded, prompts = toy
    engine = toy_engine(loaded)
    previous, current = prompts[0][-2], prompts[0][-1]
    state = engine.new_state()
    draft = engine.update(state, previous, ("drafting", "drafting")).answer
    # The cache now holds the previous prompt and the answer in commit order.
    sequence = list(zip(current + draft, range(len(current) + len(draft))))
    assert min(common_prefix_length(state.cached, sequence), len(current) - 1) > 0
    reused = engine.verify_draft(state, current, draft, None)
    scratch = engine.verify_draft(engine.new_state(), current, draft, None)
    torch.testing.assert_close(reused, scratch, atol=1e-4, rtol=0)
    assert state.cached == sequence
    stream = engine.stream(prompts[0])
    assert stream.final.draft_length == len(stream.steps[-2].answer)


def test_runner_with_engine_refusion_writes_records_and_resumes(tiny_refusion_dir, tmp_path):
    decode = DecodeSpec(engine="refusion", regenerate="plain", max_new_tokens=16, slot_size=4, serial_blocks=2,
                        acceptance="threshold:0.5")
    settings = dict(model=str(tiny_refusion_dir), output_dir=str(tmp_path), decode=decode)
    summary = run_evaluation(EvalConfig(**settings, limit=2))
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert len(lines) == 2 and summary["requests"] == 2
    assert record["engine"] == "refusion" and record["min_residual_forwards"] == 3  # draft_end=decode, the default
    assert 1 <= record["residual_forwards"] and 1 <= record["baseline_forwards"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert "minimum_cost_share" in written and written["residual_floor"] == 3
    records = read_jsonl(tmp_path / "results.jsonl")
    bound = statistics.median(r["baseline_forwards"] / 3 for r in records)
    assert written["floor_bound_median"] == pytest.approx(bound)
    assert written["floor_bound_share"] == pytest.approx(written["speedup_forwards_median"] / bound)
    summary = run_evaluation(EvalConfig(**settings, limit=3))
    assert (tmp_path / "results.jsonl").read_text().splitlines()[:2] == lines
    assert len(read_jsonl(tmp_path / "results.jsonl")) == 3 == summary["requests"]
    with pytest.raises(ValueError, match="slot_size"):
        run_evaluation(EvalConfig(**(settings | {"decode": replace(decode, slot_size=8)}), limit=3))


def test_a_model_without_a_mask_token_is_a_clear_error(tiny_qwen3_dir):
    config = EvalConfig(model=str(tiny_qwen3_dir), decode=DecodeSpec(engine="refusion", regenerate="plain"))
    with pytest.raises(ValueError, match="no <\\|mask\\|> token"):
        StreamingEvaluator(load_model(str(tiny_qwen3_dir), device="cpu"), config)
