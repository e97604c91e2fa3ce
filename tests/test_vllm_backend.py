"""vLLM as the generation engine (`backend=vllm`), against transformers on the embedded SmolLM2.

The vLLM tests need the vLLM environment (`bash scripts/setup_vllm.sh`, which `make test`
runs); without it they are skipped with the reason. They load SmolLM2-135M and start vLLM
engines (about a minute on 2 busy cores), hence `slow`. The agreement figures they print
(`-n 0 -s`: one process, output shown) are the ones the README reports.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

# first_divergence lives with the script that reports it (benchmarks/, not shipped).
from greedy_divergence import first_divergence

from data_builders.answer_cache import AnswerCache
from data_builders.build import build
from data_builders.config import BuildConfig
from data_builders.generation import cache_path
from eval.benchmarks import get_benchmark
from eval.engines.acceptance import AcceptanceRule
from eval.engines.decode import DecodeSpec
from eval.engines.fast_path import TransformersDrafter, batched_greedy, round_drafts
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.config import load_config
from headstart.vllm_client import vllm_unavailable

EMBEDDED = Path(__file__).resolve().parents[1] / "data_builders" / "embedded"
MISSING = vllm_unavailable()
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=f"vLLM backend not testable: {MISSING}")
# fp32 on both sides, but other kernels: a near-tie is a gap of this order or less.
NEAR_TIE = 1e-2
REQUESTS = 4
MAX_NEW_TOKENS = 48


def test_scores_rule_matches_the_logits_rule():
    """vLLM verifies from (log-probability, rank) per draft token; transformers from logits."""
    torch.manual_seed(0)
    logits = torch.randn(12, 50) * 3
    draft = logits.argmax(-1).tolist()
    draft[7] = int(logits[7].argsort()[-2])  # the runner-up: greedy stops there
    logprobs = torch.log_softmax(logits, -1)
    scores = [(logprobs[j, t].item(), int((logits[j] > logits[j, t]).sum()) + 1) for j, t in enumerate(draft)]
    for spec in ("greedy", "threshold:0", "threshold:0.3", "threshold:0.9", "threshold:1"):
        rule = AcceptanceRule.parse(spec)
        assert rule.accepted_length_from_scores(scores) == rule.accepted_length(logits, draft), spec
    assert AcceptanceRule.parse("greedy").accepted_length_from_scores(scores) == 7


def test_vllm_backend_needs_the_fast_path():
    with pytest.raises(ValueError, match="fast path"):
        EvalConfig(backend="vllm", decode=DecodeSpec(engine="stepwise"))
    with pytest.raises(ValueError, match="backend must be"):
        EvalConfig(backend="sglang")


def test_the_report_says_what_ran_on_vllm_and_what_was_timed():
    from eval.evaluation.runner import timing_note

    assert timing_note(EvalConfig(backend="vllm")) == ("Drafting (counted, not timed) on vllm; the baselines and the "
                                                      "timed residual phase on transformers at batch 1.")


def test_a_missing_vllm_environment_is_refused_before_any_model_loads(tmp_path):
    from eval.evaluation.runner import prepare_evaluation
    from headstart.vllm_settings import VLLMSettings

    absent = VLLMSettings(python=str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(ValueError, match="backend=vllm: no vLLM environment at .*no-venv.*scripts/setup_vllm.sh"):
        prepare_evaluation(EvalConfig(model="/nonexistent/model", backend="vllm", vllm=absent, limit=1))
    with pytest.raises(ValueError, match="generation.backend=vllm: no vLLM environment"):
        build(load_config(BuildConfig, ["recipe=embedded_prefix", "generation.backend=vllm", f"output_dir={tmp_path / 'o'}",
                                        f"generation.vllm.python={absent.python}"]))
    assert not (tmp_path / "o").exists()


@needs_vllm
def test_the_cpu_build_of_vllm_is_refused_for_a_gpu_run():
    assert vllm_unavailable(device="cpu") is None
    assert "is a cpu build and this run is on cuda" in vllm_unavailable(device="cuda:0")


def test_round_drafts_is_the_same_on_any_drafter(tiny_qwen3_dir):
    """round_drafts only asks its drafter for tokens: a drafter that records the calls and
    forwards them to the transformers one changes nothing."""
    from headstart.models import load_model

    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    config = EvalConfig(model=str(tiny_qwen3_dir), decode=DecodeSpec(acceptance="threshold:0.5", max_new_tokens=16))
    evaluator = StreamingEvaluator(loaded, config)
    prompts = [evaluator.prompts(r)[:-1] for r in get_benchmark("humaneval").load(3)]
    direct = round_drafts(evaluator.drafter, prompts, config.decode, evaluator.engine.eos_token_ids)
    calls = []

    class Recording(TransformersDrafter):
        def greedy(self, prompts, max_new_tokens):
            calls.append(("greedy", len(prompts)))
            return super().greedy(prompts, max_new_tokens)

        def accepted_lengths(self, prompts, drafts, rule):
            calls.append(("verify", len(prompts)))
            return super().accepted_lengths(prompts, drafts, rule)

    recording = Recording(loaded.model, loaded.tokenizer.pad_token_id, evaluator.engine.eos_token_ids, config.fast_batch_size)
    assert round_drafts(recording, prompts, config.decode, evaluator.engine.eos_token_ids) == direct
    assert calls[0] == ("verify", 3)  # one round: every request's verify pass in one call


# --- against vLLM ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    from headstart.models import load_model

    return load_model("smollm2", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def requests():
    return get_benchmark("humaneval").load(REQUESTS)


def eval_config(**changes) -> EvalConfig:
    decode = DecodeSpec(max_new_tokens=changes.pop("max_new_tokens", MAX_NEW_TOKENS),
                        acceptance=changes.pop("acceptance", "greedy"))
    return EvalConfig(model="smollm2", decode=decode, fast_batch_size=256, record_tokens=True, **changes)


@pytest.fixture(scope="module")
def vllm_evaluator(smollm2):
    """The evaluator with backend=vllm: its engines start once for the module."""
    evaluator = StreamingEvaluator(smollm2, eval_config(backend="vllm"))
    yield evaluator
    evaluator.close()


def sharing_drafter(evaluator: StreamingEvaluator, vllm_evaluator: StreamingEvaluator) -> StreamingEvaluator:
    """`evaluator` drafting on the module's vLLM engine (one engine start for the module)."""
    evaluator.drafter, evaluator.config = vllm_evaluator.drafter, replace(evaluator.config, backend="vllm")
    return evaluator


def agreement(name: str, same: list[bool]) -> None:
    print(f"\n{name}: {sum(same)}/{len(same)} agree")


def compare_records(name: str, by_transformers: list[dict], by_vllm: list[dict]) -> None:
    """Where the drafts agree, everything counted agrees: forwards are computed from the tokens."""
    same = [t["draft_token_ids"] == v["draft_token_ids"] for t, v in zip(by_transformers, by_vllm)]
    agreement(name, same)
    for t, v, agree in zip(by_transformers, by_vllm, same):
        assert v["drafting_backend"] == "vllm" and t["drafting_backend"] == "transformers"
        if agree:
            for key in ("drafting_forwards", "residual_forwards", "stream_token_ids", "accepted_tokens", "draft_tokens"):
                assert t[key] == v[key], (t["request_id"], key)
    assert sum(same) >= len(same) - 1


@pytest.mark.slow
@needs_vllm
def test_evaluator_greedy_drafting_on_vllm_counts_like_transformers(smollm2, requests, vllm_evaluator):
    """Count mode on both sides: every prefix's greedy draft, and D_n, the answer, drafted by the
    backend (vLLM in one batch, transformers in padded batches), so every count comes from its
    tokens (the timed path on vLLM: the threshold test below). Where a draft differs, the first
    differing token is a floating-point near-tie."""
    counted = frozenset(request.request_id for request in requests)
    on_transformers = StreamingEvaluator(smollm2, eval_config(), untimed=counted).evaluate_many(requests)
    on_vllm = sharing_drafter(StreamingEvaluator(smollm2, eval_config(), untimed=counted),
                              vllm_evaluator).evaluate_many(requests)
    compare_records("greedy rule, counted records", on_transformers, on_vllm)
    same = []
    for request, by_transformers, by_vllm in zip(requests, on_transformers, on_vllm):
        prompts = vllm_evaluator.prompts(request)
        assert len(by_transformers["draft_token_ids"]) == len(by_vllm["draft_token_ids"]) >= len(prompts) - 1
        for prompt, a, b in zip(prompts, by_transformers["draft_token_ids"], by_vllm["draft_token_ids"]):
            same.append(a == b)
            if a != b:
                divergence = first_divergence(smollm2.model, prompt, a, b)
                assert divergence is not None, "one answer stops early: an EOS handling bug"
                print(f"  token {divergence.index}: logit gap {divergence.gap:+.2e}")
                assert abs(divergence.gap) < NEAR_TIE
    agreement(f"greedy drafts of {len(same)} prefixes ({REQUESTS} HumanEval requests, {MAX_NEW_TOKENS} tokens)", same)
    assert sum(same) >= 0.8 * len(same)


@pytest.mark.slow
@needs_vllm
def test_evaluator_threshold_drafting_on_vllm_counts_like_transformers(smollm2, requests, vllm_evaluator):
    """threshold:TAU: verify by vLLM prompt log-probabilities, regenerate from the accepted prefix.
    At 0.5 and 24 tokens HumanEval/0's drafts are kept whole and HumanEval/3's in part (at 0.9
    nothing is kept on any of them: a weaker test)."""
    chosen = [requests[0], requests[3]]
    config = eval_config(acceptance="threshold:0.5", max_new_tokens=24)
    by_transformers = StreamingEvaluator(smollm2, config).evaluate_many(chosen)
    by_vllm = sharing_drafter(StreamingEvaluator(smollm2, config), vllm_evaluator).evaluate_many(chosen)
    compare_records("threshold:0.5, evaluator records", by_transformers, by_vllm)
    assert any(0 < r["accepted_tokens"] < r["draft_tokens"] for r in by_transformers)


@pytest.mark.slow
@needs_vllm
def test_self_distilled_data_built_on_vllm_matches_and_trains(tmp_path, smollm2):
    """The embedded recipe's first 12 answers regenerated by vLLM (the shipped cache holds the other
    24), against the shipped ones (SmolLM2's transformers answers); the data of both backends loads
    into the trainer."""
    from train.data import load_split
    from train.provenance import check_answer_models
    from train.tokenization import tokenize_dataset

    regenerated = 12
    lines = (EMBEDDED / "smollm2_answers.jsonl").read_text().splitlines(keepends=True)
    rest = tmp_path / "shipped_rest.jsonl"
    rest.write_text("".join(lines[regenerated:]))
    outputs = {
        "vllm": build(load_config(BuildConfig, ["recipe=embedded_prefix", f"output_dir={tmp_path / 'vllm'}",
                                                "generation.backend=vllm", f"generation.cache_files=[{rest}]",
                                                f"generation.batch_size={regenerated}"])),
        "transformers": build(load_config(BuildConfig, ["recipe=embedded_prefix", f"output_dir={tmp_path / 'hf'}"])),
    }
    shipped = [json.loads(line) for line in lines[:regenerated]]
    fresh = AnswerCache(cache_path(tmp_path / "vllm.work", "smollm2"))
    assert len(fresh.answers) == regenerated  # exactly the answers missing from the cache were generated
    same = [fresh.get(e["key"]) == e["answer"] for e in shipped]
    agreement(f"self-distilled answers ({regenerated} embedded requests, 192 tokens), vLLM vs shipped transformers", same)
    assert all(fresh.finished(e["key"]) == e["finished"] for e, agree in zip(shipped, same) if agree)
    assert sum(same) >= 0.8 * len(same)
    for backend, output in outputs.items():
        train = load_split(str(output), "train")
        assert check_answer_models(train, str(output), "smollm2", allowed=False) == []
        tokenized = tokenize_dataset(train, smollm2.tokenizer, smollm2.family, "incomplete_request")
        assert len(tokenized) > 0 and all(sum(row["completion_mask"]) > 0 for row in tokenized), backend


@pytest.mark.slow
@needs_vllm
def test_lora_adapter_through_vllm_matches_peft(tmp_path, smollm2, requests):
    """An adapter directory drafts through vLLM's LoRA as PEFT decodes it on transformers."""
    from peft import LoraConfig, get_peft_model

    from eval.engines.vllm_drafter import VLLMDrafter
    from headstart.models import load_model
    from headstart.vllm_settings import VLLMSettings

    base = load_model("smollm2", device="cpu", dtype="float32").model
    torch.manual_seed(0)  # seeds lora_A's initialisation too: the same adapter on every machine
    adapted = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    for name, parameter in adapted.named_parameters():
        if "lora_B" in name:  # a trained-looking adapter: B is zero at initialisation
            torch.nn.init.normal_(parameter, std=0.2)
    adapted.save_pretrained(tmp_path / "adapter")
    config_path = tmp_path / "adapter" / "adapter_config.json"
    config_path.write_text(json.dumps(json.loads(config_path.read_text()) | {"base_model_name_or_path": "smollm2"}))
    peft = load_model(str(tmp_path / "adapter"), device="cpu", dtype="float32")
    prompts = [p for request in requests[:2] for p in StreamingEvaluator(smollm2, eval_config()).prompts(request)[:-1]]
    eos = {smollm2.tokenizer.eos_token_id}
    on_peft = batched_greedy(peft.model, prompts, smollm2.tokenizer.pad_token_id, eos, 24)
    drafter = VLLMDrafter.start(str(tmp_path / "adapter"), None, VLLMSettings(), None, "cpu", eos)
    try:
        on_vllm = drafter.greedy(prompts, 24)
    finally:
        drafter.close()
    plain = batched_greedy(smollm2.model, prompts, smollm2.tokenizer.pad_token_id, eos, 24)
    same = [a == b for a, b in zip(on_peft, on_vllm)]
    agreement(f"LoRA drafts of {len(prompts)} prefixes, vLLM LoRA vs PEFT", same)
    changed = sum(a != b for a, b in zip(on_peft, plain))
    assert changed >= len(prompts) // 2, changed  # the adapter changes the answers: agreement means it was applied
    assert sum(same) >= 0.8 * len(same)
