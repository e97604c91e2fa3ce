"""Draft-guided regeneration (`decode.regenerate=lookup`): lossless against a naive
decoder written here, counts computed from tokens equal to the counts executed,
and forwards hand-counted on token sequences made up here."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from test_ar_engine import MAX_NEW_TOKENS, make_evaluator, naive_greedy

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.lookup import Proposer, regeneration_widths, update_cost, update_proposer
from eval.engines.lookup_policy import LookupPolicy
from eval.engines.token_tree import tree_matched
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.config import RecipeError, load_config
from headstart.models import load_model

EOS = 99
POLICY = LookupPolicy(max_ngram=3, block=10, occurrence="first", min_ngram=1)


@pytest.fixture(scope="module")
def humaneval_requests():
    return get_benchmark("humaneval").load(limit=6)


# ---------------------------------------------------------------- hand-counted


def test_an_inserted_token_costs_one_plain_step_then_the_draft_rejoins():
    """Held draft 1 2 3 4 5 6 7 EOS; the answer inserts 9 after 1 2. Verify keeps 1 2
    and yields 9; nothing follows (2, 9) or 9 anywhere, so one plain step yields 3;
    3 is found in the held tail, which proposes 4 5 6 7 EOS: all kept in one forward.
    Verify + 2 forwards, against 9 - 2 = 7 with plain regeneration."""
    held, answer = [1, 2, 3, 4, 5, 6, 7, EOS], [1, 2, 9, 3, 4, 5, 6, 7, EOS]
    proposer = Proposer([held[2:], [], [50, 51]], POLICY, {EOS})
    assert len(regeneration_widths(answer, 2, proposer, max_new_tokens=64)) == 2
    assert len(regeneration_widths(answer, 2, None, max_new_tokens=64)) == 6


def test_a_renamed_token_costs_two_steps_and_the_block_size_bounds_a_forward():
    """`x = f(a); return x` -> `y = f(a); return y` (one token each). Verify rejects x
    and yields y; y is nowhere in the sources, so a plain step yields `=`; `=` proposes
    `f(a); return x EOS`: six kept, x is wrong and the forward yields y instead; a
    plain step yields EOS. Verify + 3 forwards; with blocks of 2, verify + 5."""
    x, y, eq, f, lp, a, rp, semi, ret = 10, 11, 12, 13, 14, 15, 16, 17, 18
    held = [x, eq, f, lp, a, rp, semi, ret, x, EOS]
    answer = [y, eq, f, lp, a, rp, semi, ret, y, EOS]
    proposer = Proposer([held, [], []], POLICY, {EOS})
    assert len(regeneration_widths(answer, 0, proposer, max_new_tokens=64)) == 3
    small = Proposer([held, [], []], LookupPolicy(3, 2, "first", 1), {EOS})
    # y -> =; (=) proposes f ( -> +a; (f ( a) proposes ) ; -> +return; (...) proposes x EOS: wrong -> y; -> EOS
    assert len(regeneration_widths(answer, 0, small, max_new_tokens=64)) == 5


def test_proposals_prefer_longer_ngrams_then_source_order_and_stop_at_eos():
    tail, earlier, request = [5, 6, 7, 1, EOS, 2], [4, 5, 6, 8, 9], [5, 6, 3]
    proposer = Proposer([tail, earlier, request], POLICY, {EOS})
    assert proposer.propose([4, 5, 6], budget=64) == [8, 9]  # the 3-gram is only in an earlier draft
    assert proposer.propose([0, 5, 6], budget=64) == [7, 1, EOS]  # (5, 6) first in the tail; cut after EOS
    assert proposer.propose([0, 5, 6], budget=2) == [7, 1]  # the answer's remaining budget
    assert proposer.propose([3], budget=64) == []  # nothing follows 3 in the request
    last = Proposer([[1, 2, 1, 3]], LookupPolicy(1, 10, "last", 1), {EOS})
    assert last.propose([1], budget=64) == [3]
    two = Proposer([tail, earlier, request], LookupPolicy(3, 10, "first", min_ngram=2), {EOS})
    assert two.propose([0, 5, 6], budget=64) == [7, 1, EOS] and two.propose([9, 7], budget=64) == []


def test_update_cost_is_one_forward_for_a_finished_draft_kept_whole():
    decode = DecodeSpec(max_new_tokens=8)
    draft = [1, 2, EOS]
    assert update_cost(draft, draft, 3, [], [7, 8], decode, {EOS}) == 1
    assert update_cost([], draft, 0, [], [7, 8], decode, {EOS}) == 3  # the lookup baseline: nothing to propose


# ------------------------------------------------------------ tiny real models


# The n-gram default, the longest-match proposer with blocks that follow the match, a token tree
# of up to 4 such continuations per forward, and one of 8 with realignment candidates after them.
LONGEST = dict(lookup_match="longest", lookup_block=4, lookup_max_block=24)
PROPOSERS = {"ngram": {}, "longest": LONGEST, "tree": LONGEST | dict(lookup_tree=4),
             "realign": LONGEST | dict(lookup_tree=8, lookup_realign=2),
             "cost": LONGEST | dict(lookup_tree=4, lookup_choice="cost")}  # and width_cost: `proposer_settings`


def proposer_settings(proposer: str, width_table) -> dict:
    """The decode settings of `proposer`; the cost chooser's with the CPU's width-cost table."""
    return PROPOSERS[proposer] | ({"width_cost": str(width_table)} if proposer == "cost" else {})


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_lookup_streaming_is_lossless_and_exercises_every_kind_of_proposal(tiny_model_dir, humaneval_requests, proposer,
                                                                          cpu_width_table):
    """Streamed answers and the lookup baseline equal a naive no-cache greedy decoder's;
    proposals that are right, partly right and wrong all occur; no update costs more
    forwards than with plain regeneration."""
    lookup = make_evaluator(tiny_model_dir, regenerate="lookup", **proposer_settings(proposer, cpu_width_table))
    plain = make_evaluator(tiny_model_dir, regenerate="plain")
    model, eos = lookup.loaded.model, lookup.engine.eos_token_ids
    for request in humaneval_requests:
        prompts = lookup.prompts(request)
        reference = naive_greedy(model, prompts[-1], eos, MAX_NEW_TOKENS)
        stream = lookup.engine.stream(prompts)
        assert stream.final.answer == reference, request.request_id
        assert lookup.engine.lookup_baseline(prompts[-1]).answer == reference
        plain_stream = plain.engine.stream(prompts)
        for with_lookup, without in zip(stream.steps, plain_stream.steps):
            assert with_lookup.answer == without.answer and with_lookup.accepted == without.accepted
            assert with_lookup.forwards <= without.forwards
    outcomes = lookup.engine.proposals
    assert outcomes["full"] and outcomes["partial"] and outcomes["wrong"], outcomes
    assert bool(lookup.engine.tree_widths) == (proposer in ("tree", "realign", "cost"))  # trees of several branches ran


@pytest.mark.parametrize(("acceptance", "proposer"), [("greedy", "ngram"), ("threshold:0.05", "ngram"),
                                                     ("greedy", "longest"), ("greedy", "tree"), ("greedy", "realign"),
                                                     ("greedy", "cost")])
def test_counts_computed_from_tokens_equal_the_counts_executed(tiny_model_dir, humaneval_requests, acceptance, proposer,
                                                               cpu_width_table):
    """Every update of the step-by-step engine against `update_cost` on its tokens,
    and the fast path's records against the step-by-step engine's, per request. The cost
    chooser verifies less than the configured tree somewhere (a CPU's wide forwards are dear);
    realignment candidates save forwards somewhere against the same tree without them."""
    settings = proposer_settings(proposer, cpu_width_table)
    stepwise = make_evaluator(tiny_model_dir, acceptance, engine="stepwise", regenerate="lookup", **settings)
    fast = make_evaluator(tiny_model_dir, acceptance, engine="fast", regenerate="lookup", **settings)
    fast.config.fast_batch_size = 12 if acceptance == "greedy" else 4
    fast.config.record_tokens = stepwise.config.record_tokens = True
    engine, eos, narrowed, realigned = stepwise.engine, stepwise.engine.eos_token_ids, 0, 0
    unrealigned = replace(stepwise.decode, lookup_realign=0)
    for request in humaneval_requests:
        prompts = stepwise.prompts(request)
        stream = engine.stream(prompts)
        held: list[int] = []
        earlier: list[list[int]] = []
        for prompt_ids, step in zip(prompts, stream.steps):
            assert step.forwards == update_cost(held, step.answer, step.accepted, earlier, prompt_ids, stepwise.decode, eos)
            if proposer == "cost":
                narrowed += narrowed_forwards(held, step.answer, step.accepted, earlier, prompt_ids, stepwise.decode, eos)
            realigned += update_cost(held, step.answer, step.accepted, earlier, prompt_ids, unrealigned, eos) - step.forwards
            if held:
                earlier.insert(0, held)
            held = step.answer
    compared = ("stream_answer", "draft_tokens", "accepted_tokens", "identical", "baseline_forwards",
                "residual_forwards", "drafting_forwards", "lookup_baseline_forwards", "draft_token_ids",
                "base_token_ids", "stream_token_ids")
    fast_records = [r for group in fast.request_groups(humaneval_requests) for r in fast.evaluate_many(group)]
    assert len(fast.request_groups(humaneval_requests)) > 1
    for request, fast_record in zip(humaneval_requests, fast_records):
        slow_record = stepwise.evaluate(request)
        assert {k: slow_record[k] for k in compared} == {k: fast_record[k] for k in compared}, request.request_id
        assert fast_record["lookup_baseline_identical"]
    assert narrowed or proposer != "cost"
    assert (realigned > 0) == (proposer == "realign")


def narrowed_forwards(held, answer, accepted, earlier, prompt_ids, decode, eos) -> int:
    """Forwards of an update where the cost chooser verified less than its proposer offered."""
    chooser = update_proposer(decode.lookup, held[accepted:], earlier, prompt_ids, eos)
    length, narrowed = accepted + 1, 0
    while length < len(answer):
        budget = decode.max_new_tokens - length - 1
        offered = chooser.proposer.branches(answer[:length], budget)
        branches = chooser.branches(answer[:length], budget)
        narrowed += branches != offered
        length = min(length + tree_matched(branches, answer[length:]) + 1, len(answer))
    return narrowed


def test_threshold_acceptance_is_unchanged_by_lookup_regeneration(tiny_qwen3_dir, humaneval_requests):
    lookup = make_evaluator(tiny_qwen3_dir, "threshold:0.05", regenerate="lookup")
    plain = make_evaluator(tiny_qwen3_dir, "threshold:0.05", regenerate="plain")
    kept = Counter()
    for request in humaneval_requests:
        prompts = lookup.prompts(request)
        with_lookup, without = lookup.engine.stream(prompts), plain.engine.stream(prompts)
        assert [(s.answer, s.accepted) for s in with_lookup.steps] == [(s.answer, s.accepted) for s in without.steps]
        kept["partial"] += 0 < with_lookup.final.accepted < with_lookup.final.draft_length
    assert kept["partial"], "no partial acceptance: the case is not exercised"


# --------------------------------------------------------------- decode config


def test_decode_settings_are_validated_when_the_config_is_built():
    assert load_config(EvalConfig, ["decode.regenerate=plain"]).decode.lookup is None
    assert load_config(EvalConfig, []).decode.lookup == LookupPolicy(3, 8, "first", 1)
    for bad, message in [("decode.regenerate=sometimes", "plain, lookup"),
                         ("decode.engine=refusion", "decode.regenerate=plain"),
                         ("decode.lookup_block=0", "lookup_block"),
                         ("decode.lookup_min_ngram=4", "lookup_min_ngram"),
                         ("decode.lookup_occurrence=middle", "first, last"),
                         ("decode.lookup_match=best", "ngram, longest"),
                         ("decode.lookup_max_block=16", "needs the companion setting decode.lookup_match=longest"),
                         ("decode.lookup_tree=4", "needs the companion setting decode.lookup_match=longest"),
                         (r"decode.lookup_tree=0", r"lookup_tree must be in \[1, 256\], not 0"),
                         ("decode.lookup_tree=100000", r"lookup_tree must be in \[1, 256\], not 100000"),
                         ("decode.lookup_block=100000", r"lookup_block must be in \[1, 256\]"),
                         ("decode.slot_size=300", r"slot_size must be in \[1, 256\]"),
                         ("decode.lookup_realign=2", "needs the companion setting decode.lookup_tree above 1"),
                         ("decode.lookup_realign=-1", r"lookup_realign must be in \[0, 64\]"),
                         ("decode.lookup_choice=best", "fixed, cost"),
                         ("decode.lookup_choice=cost", "set decode.width_cost"),
                         ("decode.width_cost=/nonexistent/table.json", "no such file"),
                         ("decode.max_new_tokens=0", "max_new_tokens"),
                         ("decode.acceptance=bogus", "threshold:TAU")]:
        with pytest.raises(ValueError, match=message):
            load_config(EvalConfig, [bad])
    with pytest.raises(RecipeError, match="did you mean decode.acceptance"):
        load_config(EvalConfig, ["acceptance=greedy"])


def test_a_results_dir_whose_config_lacks_a_setting_is_not_resumed(tiny_qwen3_dir, tmp_path):
    """A number-deciding setting config.json does not record is unknown, not its default."""
    import json

    from eval.evaluation.runner import run_evaluation

    config = EvalConfig(model=str(tiny_qwen3_dir), output_dir=str(tmp_path), limit=1,
                        decode=DecodeSpec(max_new_tokens=8, regenerate="plain"))
    run_evaluation(config)
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["regenerate"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    for regenerate in ("plain", "lookup"):
        with pytest.raises(ValueError, match=f"regenerate: None -> '{regenerate}'"):
            run_evaluation(EvalConfig(model=str(tiny_qwen3_dir), output_dir=str(tmp_path), limit=1,
                                      decode=DecodeSpec(max_new_tokens=8, regenerate=regenerate)))


# ------------------------------------------------------------------- SmolLM2


@pytest.mark.slow
@pytest.mark.parametrize("acceptance", ["threshold:0.5"])
def test_smollm2_fast_path_counts_equal_the_executed_counts(acceptance):
    """The real model on HumanEval/3, whose drafts are partly kept at this threshold, 24
    tokens: the fast path's computed drafting and residual forwards equal the step-by-step
    engine's executed ones (greedy: on the tiny models in tests/test_count_mode.py, beside the
    counted records)."""
    loaded = load_model("smollm2", device="cpu")
    decode = DecodeSpec(acceptance=acceptance, max_new_tokens=24)
    requests = get_benchmark("humaneval").load(limit=4)[3:]
    fast = StreamingEvaluator(loaded, EvalConfig(model="smollm2", decode=decode))
    stepwise = StreamingEvaluator(loaded, EvalConfig(model="smollm2", decode=DecodeSpec(
        acceptance=acceptance, max_new_tokens=24, engine="stepwise")))
    compared = ("stream_answer", "accepted_tokens", "residual_forwards", "drafting_forwards", "lookup_baseline_forwards")
    fast_records = fast.evaluate_many(requests)
    for fast_record, request in zip(fast_records, requests):
        slow_record = stepwise.evaluate(request)
        assert {k: slow_record[k] for k in compared} == {k: fast_record[k] for k in compared}, request.request_id
    # A draft kept in part exercises both the kept prefix and the regenerated rest.
    assert any(0 < r["accepted_tokens"] < r["draft_tokens"] for r in fast_records)
