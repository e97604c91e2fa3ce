"""The bidirectional control: full attention really is on, the LLaDA-style decoder
costs its step count, and the verifier study (benchmarks/study_verifier.py) shows a causal verifier rejecting
a foreign draft that a bidirectional one approves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from study_verifier import VerifierCheckConfig, check, main

from eval.benchmarks import get_benchmark
from eval.engines.bidirectional import BidirectionalEngine, bidirectional_logits
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.models import load_model
from headstart.refusion import add_refusion_tokens, mask_token_id

MAX_NEW_TOKENS = 12
STEPS = 5


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory, tiny_tokenizer_dir, tiny_tokenizer) -> Path:
    """A tiny random Qwen3 with tied input and output embeddings (and a mask token).
    Its residual stream at position j carries token j's own embedding, and the tied
    output layer scores each token by its similarity to that stream: at position j
    the token that is there wins. Judged at its own position (bidirectional), any
    token is approved; judged from the position before (causal), only a repeat."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    config = Qwen3Config(
        vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
        bos_token_id=tiny_tokenizer.bos_token_id, eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    add_refusion_tokens(model, tokenizer)
    directory = tmp_path_factory.mktemp("tiny_tied")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tied(tied_dir):
    return load_model(str(tied_dir), device="cpu")


def test_the_4d_mask_really_turns_causality_off(tiny_refusion_dir):
    model = load_model(str(tiny_refusion_dir), device="cpu").model
    tokens = list(range(10, 30))
    changed = tokens[:-1] + [tokens[-1] + 1]
    bidirectional = [bidirectional_logits(model, t, keep=len(t))[0] for t in (tokens, changed)]
    assert not torch.allclose(*bidirectional), "position 0 must see the last token"
    with torch.no_grad():
        causal = [model(input_ids=torch.tensor([t])).logits[0, 0] for t in (tokens, changed)]
    torch.testing.assert_close(*causal)  # the control: causally, position 0 cannot see it


def bidirectional_decode(acceptance: str = "greedy") -> DecodeSpec:
    return DecodeSpec(engine="bidirectional", regenerate="plain", acceptance=acceptance,
                      max_new_tokens=MAX_NEW_TOKENS, diffusion_steps=STEPS)


def make_engine(loaded, acceptance: str = "greedy") -> BidirectionalEngine:
    eos = {loaded.tokenizer.eos_token_id}
    return BidirectionalEngine(loaded.model, mask_token_id(loaded.tokenizer), eos, bidirectional_decode(acceptance))


def test_the_decoder_costs_its_step_count_and_an_empty_draft_is_the_baseline(tiny_refusion_dir):
    config = EvalConfig(model=str(tiny_refusion_dir), decode=bidirectional_decode("threshold:1"))
    evaluator = StreamingEvaluator(load_model(str(tiny_refusion_dir), device="cpu"), config)
    engine = evaluator.engine
    for request in get_benchmark("humaneval").load(limit=2):
        prompts = evaluator.prompts(request)
        baseline = engine.baseline(prompts[-1])
        assert baseline.forwards == STEPS == len(engine.schedule(MAX_NEW_TOKENS))
        assert sum(engine.schedule(MAX_NEW_TOKENS)) == MAX_NEW_TOKENS and 1 <= len(baseline.answer) <= MAX_NEW_TOKENS
        streamed = engine.stream(prompts[-1:]).final
        assert (streamed.answer, streamed.forwards) == (baseline.answer, baseline.forwards)
        # threshold:1 keeps only tokens of probability exactly 1, none here (asserted): the verification
        # pass, then a full denoise.
        final = engine.stream(prompts).final
        assert final.accepted == 0 < final.draft_length
        assert final.forwards == 1 + STEPS
    residue = engine.schedule(MAX_NEW_TOKENS // 2)
    assert len(residue) == 3 and sum(residue) == MAX_NEW_TOKENS // 2  # a residue takes its share of the steps


def test_the_bidirectional_verifier_approves_any_draft_it_sees(tied):
    """A foreign draft ending in EOS is kept whole at the minimum cost (1 forward)."""
    engine = make_engine(tied)
    prompt = tied.tokenizer.encode("Write a function. Answer the request.")
    draft = tied.tokenizer.encode("def add(a, b):\n    return a + b\n") + [tied.tokenizer.eos_token_id]
    state = engine.new_state()
    state.draft = draft
    result = engine.update(state, prompt, ("verify", "regenerate"))
    assert result.accepted == len(draft) and result.answer == draft
    assert result.forwards == engine.min_residual_forwards == 1


def test_verifier_check_causal_rejects_what_bidirectional_approves(tied):
    """Canonical solutions of other problems as drafts (the tied toy's own greedy
    answers repeat one token, which even a causal verifier would approve). The
    margins are wide by construction (see `tied_dir`): measured 0% kept and 0%
    approved causally, 100% and 100% bidirectionally; the bounds leave room."""
    figures = {
        verifier: check(VerifierCheckConfig(model="tied", verifier=verifier, drafts="reference", limit=6,
                                            decode=DecodeSpec(max_new_tokens=32)), tied)["foreign"]
        for verifier in ("causal", "bidirectional")
    }
    assert figures["causal"]["leading_run_share"] < 0.1 and figures["causal"]["token_approval_rate"] < 0.1
    assert figures["bidirectional"]["leading_run_share"] > 0.9 and figures["bidirectional"]["token_approval_rate"] > 0.9
    # The ReFusion engine's own verify pass (the one its update calls), under draft-refinement settings: it
    # judges right after the prompt, as the causal verifier does, and so rejects the foreign draft too.
    refining = DecodeSpec(engine="refusion", regenerate="plain", max_new_tokens=32, draft_in_context=True)
    refusion = check(VerifierCheckConfig(model="tied", verifier="refusion", drafts="reference", limit=6, decode=refining),
                     tied)["foreign"]
    assert refusion == pytest.approx(figures["causal"])


def test_verifier_check_cli_rejects_an_unknown_verifier(capsys):
    assert main(["verifier=sideways"]) == 2
    assert "causal, bidirectional, refusion" in capsys.readouterr().err


def test_verifier_check_limits_are_checked_before_any_model_loads(tmp_path, tiny_qwen3_dir, capsys, monkeypatch):
    import study_verifier

    monkeypatch.setattr(study_verifier, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    output = tmp_path / "figures.json"
    for limit in (-1, 1):
        assert main([f"limit={limit}", f"output={output}"]) == 2
        assert "limit must be" in capsys.readouterr().err
    assert main(["limit=0", "model=/no/such/model", f"output={output}"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["limit=0", f"model={tiny_qwen3_dir}", f"output={output}"]) == 0  # check only: found, not loaded
    assert "limit=0" in capsys.readouterr().out and not output.exists()


@pytest.mark.slow
def test_smollm2_causal_verifier_cuts_foreign_drafts_and_keeps_its_own():
    """The real model keeps its own greedy answers and rejects most of the answer
    to another HumanEval problem."""
    figures = check(VerifierCheckConfig(model="smollm2", verifier="causal", limit=4, decode=DecodeSpec(max_new_tokens=32),
                                        device="cpu"))
    assert figures["own"]["leading_run_share"] > 0.9
    assert figures["foreign"]["leading_run_share"] < 0.5
    assert figures["foreign"]["token_approval_rate"] < figures["own"]["token_approval_rate"]
