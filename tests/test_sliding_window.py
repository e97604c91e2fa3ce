"""Models with sliding-window layers (Gemma-3) stream past their window, and the engines'
answers stay the model's: a tiny random Gemma-3 with a 16-token window, prompts of about
40 tokens and answers of 24, against a naive decoder that re-feeds the whole sequence
every step with no cache (the model's own sliding-window mask, nothing reused). Both classes
a Gemma-3 loads as: Gemma3ForCausalLM (the 270M, the 1B) and Gemma3ForConditionalGeneration
(gemma-3-12b-it), whose config keeps the window and the layer types in `text_config` only.

transformers' sliding cache layers drop states older than the window, so the engines'
crop back to the accepted prefix used to raise once the window was full."""

from __future__ import annotations

import pytest
import torch
from test_ar_engine import naive_greedy
from transformers import (
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    PreTrainedModel,
    SiglipVisionConfig,
)

from eval.engines.ar import AREngine
from eval.engines.base import new_cache
from eval.engines.decode import DecodeSpec
from eval.engines.fast_path import TransformersDrafter, batched_greedy, final_update, greedy_drafting, round_drafts
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from headstart.config import load_config
from headstart.files import read_jsonl
from headstart.models import load_model
from headstart.segment import prefixes, segment_text

WINDOW = 16
MAX_NEW_TOKENS = 24
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
REQUEST = "Write a function that sums a list. Answer the request. Explain the result in one sentence. Be brief."


def tiny_gemma3(tokenizer, attn_implementation: str, sliding_window: int = WINDOW,
                multimodal: bool = False) -> PreTrainedModel:
    """A seeded random 4-layer Gemma-3, sliding and full layers alternating; `multimodal`: the same
    decoder inside a Gemma3ForConditionalGeneration with a one-layer vision tower."""
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=sliding_window,
        layer_types=LAYER_TYPES, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        attn_implementation=attn_implementation,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(text).eval()
    if multimodal:
        vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                    image_size=28, patch_size=14)
        # The image tokens are ids the prompts never hold (the tokenizer's last three).
        config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                              boi_token_index=len(tokenizer) - 3, eoi_token_index=len(tokenizer) - 2,
                              image_token_index=len(tokenizer) - 1, tie_word_embeddings=False,
                              attn_implementation=attn_implementation)
        causal, model = model, Gemma3ForConditionalGeneration(config).eval()
        # The causal model's decoder: the same answers, so the same partial drafts are exercised.
        model.model.language_model.load_state_dict(causal.model.state_dict())
        model.lm_head.load_state_dict(causal.lm_head.state_dict())
        assert getattr(model.config, "layer_types", None) is None  # as gemma-3-12b-it: the window is text_config's
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)  # as tests/conftest.py: greedy depends visibly on the prompt
    return model


MODELS = {"eager": ("eager", False), "sdpa": ("sdpa", False), "multimodal-sdpa": ("sdpa", True),
          "multimodal-eager": ("eager", True)}


@pytest.fixture(scope="module", params=list(MODELS))
def gemma3(request, tiny_tokenizer) -> PreTrainedModel:
    attn_implementation, multimodal = MODELS[request.param]
    return tiny_gemma3(tiny_tokenizer, attn_implementation, multimodal=multimodal)


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer) -> list[list[int]]:
    """S_1..S_n of a four-sentence request, tokenized; S_n is 46 tokens, S_1 11."""
    token_prompts = [tiny_tokenizer(text).input_ids for text in prefixes(segment_text(REQUEST))]
    assert len(token_prompts) == 4 and 2 * WINDOW < len(token_prompts[-1]) < 3 * WINDOW
    return token_prompts


# Plain regeneration, lookup's default, and token trees (each sliding layer masked to its window).
REGENERATIONS = {"plain": dict(regenerate="plain"), "lookup": dict(regenerate="lookup"),
                 "tree": dict(regenerate="lookup", lookup_match="longest", lookup_tree=4)}


def engine_for(model, tokenizer, regenerate: str, acceptance: str = "greedy") -> AREngine:
    decode = DecodeSpec(engine="stepwise", acceptance=acceptance, max_new_tokens=MAX_NEW_TOKENS,
                        **REGENERATIONS[regenerate])
    return AREngine(model, {tokenizer.eos_token_id}, decode)


def test_the_window_decides_the_answers(gemma3, tiny_tokenizer, prompts):
    """The same weights with a window wider than the sequence answer otherwise: the
    naive reference below really depends on the sliding-window mask."""
    eos = {tiny_tokenizer.eos_token_id}
    multimodal = isinstance(gemma3, Gemma3ForConditionalGeneration)
    unwindowed = tiny_gemma3(tiny_tokenizer, gemma3.config._attn_implementation, sliding_window=512, multimodal=multimodal)
    unwindowed.load_state_dict(gemma3.state_dict())
    assert naive_greedy(gemma3, prompts[-1], eos, MAX_NEW_TOKENS) != naive_greedy(unwindowed, prompts[-1], eos, MAX_NEW_TOKENS)


@pytest.mark.parametrize("regenerate", REGENERATIONS)
def test_streaming_past_the_window_gives_the_models_answer(gemma3, tiny_tokenizer, prompts, regenerate):
    engine = engine_for(gemma3, tiny_tokenizer, regenerate)
    reference = naive_greedy(gemma3, prompts[-1], engine.eos_token_ids, MAX_NEW_TOKENS)
    stream = engine.stream(prompts)
    assert len(reference) == MAX_NEW_TOKENS  # prompt + answer span several windows
    assert [step.answer for step in stream.steps] == [
        naive_greedy(gemma3, p, engine.eos_token_ids, MAX_NEW_TOKENS) for p in prompts
    ]
    assert 0 < stream.final.accepted < stream.final.draft_length, "the crop to a partial draft is not exercised"
    assert engine.baseline(prompts[-1]).answer == reference
    assert engine.lookup_baseline(prompts[-1]).answer == reference
    assert bool(engine.tree_widths) == (regenerate == "tree")


def test_a_cropped_cache_verifies_like_a_forward_from_scratch(gemma3, tiny_tokenizer, prompts):
    """Cache over S_{n-1} + its answer (past the window), cropped to the shared prefix,
    then the rest fed: the logits of a forward with no cache. Tolerance 1e-4 on fp32."""
    engine = engine_for(gemma3, tiny_tokenizer, "plain")
    draft = engine.baseline(prompts[-2]).answer
    state = engine.new_state()
    engine.prime(state, prompts[-2], draft)
    assert len(state.cached_ids) > 2 * WINDOW
    engine.crop(state, len(prompts[-2]) - 1)
    sequence = prompts[-1] + draft
    cropped = engine.forward(state, sequence[len(prompts[-2]) - 1 :], None, logits_to_keep=len(draft) + 1)
    with torch.no_grad():
        scratch = gemma3(torch.tensor([sequence]), use_cache=False, logits_to_keep=len(draft) + 1).logits[0]
    torch.testing.assert_close(cropped, scratch, atol=1e-4, rtol=0)


def test_new_cache_keeps_every_state_of_every_layer(gemma3):
    cache = new_cache(gemma3)
    assert len(cache.layers) == len(LAYER_TYPES) and not any(cache.is_sliding)


@pytest.mark.parametrize("acceptance", ["greedy", "threshold:0.05"])
@pytest.mark.parametrize("regenerate", REGENERATIONS)
def test_fast_path_counts_equal_the_engines(gemma3, tiny_tokenizer, prompts, acceptance, regenerate):
    """Drafting batched across the prefixes (left-padded, past the window) and the final
    update from the state it leaves: the stepwise engine's drafts, answer and forwards."""
    engine = engine_for(gemma3, tiny_tokenizer, regenerate, acceptance)
    stream = engine.stream(prompts)
    if engine.rule.lossless:
        drafts = batched_greedy(gemma3, prompts[:-1], tiny_tokenizer.pad_token_id, engine.eos_token_ids, MAX_NEW_TOKENS)
        drafting = greedy_drafting(drafts, prompts, engine.spec, engine.eos_token_ids)
    else:
        drafter = TransformersDrafter(gemma3, tiny_tokenizer.pad_token_id, engine.eos_token_ids, batch_size=4)
        drafting = round_drafts(drafter, [prompts[:-1]], engine.spec, engine.eos_token_ids)[0]
    final = final_update(engine, prompts, drafting)
    assert drafting.drafts == [step.answer for step in stream.steps[:-1]]
    assert drafting.forwards == stream.drafting_forwards
    assert (final.answer, final.accepted, final.forwards) == (stream.final.answer, stream.final.accepted, stream.final.forwards)


@pytest.mark.parametrize("regenerate", REGENERATIONS)
def test_the_evaluator_streams_a_saved_multimodal_gemma3_losslessly(tiny_tokenizer, tmp_path, regenerate):
    """As a user runs it (`python -m eval model=<dir> benchmark=humaneval`): the directory loads as
    Gemma3ForConditionalGeneration, prompts run past the window, and every streamed answer, on the fast
    path and step by step, is the batch-1 baseline's (the tree with the text config's window: issue 47)."""
    directory = tmp_path / "gemma3-multimodal"
    tiny_gemma3(tiny_tokenizer, "sdpa", multimodal=True).save_pretrained(directory)
    tiny_tokenizer.save_pretrained(directory)
    decode = {f"decode.{key}={value}" for key, value in REGENERATIONS[regenerate].items()}
    for engine in ("fast", "stepwise"):
        config = load_config(EvalConfig, [f"model={directory}", "benchmark=humaneval", "limit=4", "decode.max_new_tokens=24",
                                          f"decode.engine={engine}", f"output_dir={tmp_path / engine}", *decode])
        loaded = load_model(str(directory), device="cpu")
        assert isinstance(loaded.model, Gemma3ForConditionalGeneration)
        summary = run_evaluation(config, loaded=loaded)
        assert summary["identical_measured"] == 4 and summary["identical_to_baseline"] == 1.0, engine
        records = read_jsonl(tmp_path / engine / "results.jsonl")
        assert all(len(r["segments"]) > 1 for r in records)
