"""data_builders with a model in the loop: self-distilled answers, drafts, and resume after a kill.

Tiny random models stand in for the base model; they decode fast enough to
build a few dozen answers in seconds and are as deterministic as a real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from datasets import load_from_disk
from test_data_builders import tree_bytes

from data_builders.answer_cache import AnswerCache, answer_key, model_identity
from data_builders.build import build
from data_builders.config import BuildConfig
from data_builders.generation import cache_path
from data_builders.report import Report
from headstart.config import load_config
from headstart.models import end_token_ids
from headstart.prompts import build_messages, render_prompt
from headstart.segment import prefixes, segment_request

ROOT = Path(__file__).resolve().parents[1]


def embedded_args(output: Path, model: Path, *extra: str) -> list[str]:
    return [
        "recipe=embedded_prefix",
        f"output_dir={output}",
        f"model={model}",
        "generation.cache_files=[]",  # the shipped SmolLM2 answers do not apply to a tiny model
        "generation.max_new_tokens=24",
        "decontamination.benchmarks=[humaneval]",
        *extra,
    ]


def cached_answer(work: Path, model: Path, tokenizer, request: str, max_new_tokens: int) -> str:
    cache = AnswerCache(cache_path(work, str(model)))
    prompt = render_prompt(tokenizer, build_messages(request))
    return cache.get(answer_key(model_identity(str(model)), prompt, max_new_tokens))


def test_self_distilled_ar_pairs(tmp_path, tiny_qwen3_ending_dir, tiny_tokenizer):
    model = tiny_qwen3_ending_dir
    output = build(load_config(BuildConfig, embedded_args(tmp_path / "out", model, "caps.max_pairs=30")))
    data = load_from_disk(str(output))
    rows = list(data["train"]) + list(data.get("validation", []))
    assert 0 < len(rows) <= 30 and {r["answer_kind"] for r in rows} == {"self"}
    assert {r["answer_model"] for r in rows} == {str(model)}  # who wrote the answers: training checks it
    rows = map(json.loads, (ROOT / "data_builders/embedded/requests.jsonl").open())
    requests = {row["id"]: row["request"] for row in rows}
    for row in rows:
        request = requests[row["source_id"]]
        assert row["messages"][1]["content"] == prefixes(segment_request(request))[row["prefix_index"] - 1]
        # the answer is the model's greedy answer to the complete request, whatever prefix is shown
        assert row["messages"][2]["content"] == cached_answer(tmp_path / "out.work", model, tiny_tokenizer, request, 24)


def test_answers_cut_at_the_token_cap_are_dropped_and_counted(tmp_path, tiny_qwen3_ending_dir, tiny_tokenizer):
    """A self-distilled answer that reaches max_new_tokens without ending used to be kept: trained
    as a complete turn, it gained an end-of-turn the model never wrote (early stopping)."""
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = tiny_qwen3_ending_dir
    output = build(load_config(BuildConfig, embedded_args(tmp_path / "out", model_dir, "caps.max_pairs=0")))
    cache = AnswerCache(cache_path(tmp_path / "out.work", str(model_dir)))
    cut = {key for key in cache.answers if cache.finished(key) is False}
    assert 0 < len(cut) < len(cache.answers) and all(cache.finished(k) is not None for k in cache.answers)
    report = Report.load(output / "report.json")
    assert report.drops["answer_hit_token_cap"] == len(cut)  # every chosen request is in the cache (no pair cap)
    assert f"{len(cut)} requests dropped (`answer_hit_token_cap`)" in (output / "README.md").read_text()

    # The flags are the truth: regenerate and look for the end token.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = map(json.loads, (ROOT / "data_builders/embedded/requests.jsonl").open())
    requests = {row["id"]: row["request"] for row in rows}
    identity = model_identity(str(model_dir))
    by_key = {answer_key(identity, render_prompt(tiny_tokenizer, build_messages(r)), 24): i for i, r in requests.items()}
    checked = 0
    for key in sorted(cache.answers)[:8]:
        prompt = render_prompt(tiny_tokenizer, build_messages(requests[by_key[key]]))
        ids = tiny_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        new = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tiny_tokenizer.pad_token_id)[0, ids.shape[1]:]
        assert cache.finished(key) == (tiny_tokenizer.eos_token_id in new.tolist()), key
        checked += 1
    assert checked == 8

    data = load_from_disk(str(output))
    rows = list(data["train"]) + list(data.get("validation", []))
    kept = {by_key[k] for k in cache.answers if k not in cut and cache.get(k).strip()}
    assert {row["source_id"] for row in rows} == kept
    cut_answers = {cache.get(k) for k in cut}
    assert not any(row["messages"][2]["content"] in cut_answers for row in rows)


def test_a_second_round_answers_with_the_adapter_as_it_is_now(tmp_path, tiny_qwen3_ending_dir, tiny_tokenizer):
    """Iterated self-distillation (docs/training.md): the next round's answers come from the adapted
    model, `model=ADAPTER`. An adapter retrained at the same path and built again into the same
    directory answers anew: a cache keyed by the path alone returned the old adapter's answers."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"

    def train_adapter(seed: int) -> None:  # a random LoRA stands in for a training round
        torch.manual_seed(seed)
        base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_ending_dir, dtype=torch.float32)
        peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # small enough that some answers still end, large enough to change some
            for name, weight in peft_model.named_parameters():
                if "lora_B" in name:
                    weight.normal_(0.0, 0.05)
        peft_model.save_pretrained(adapter)

    def answers_built() -> dict[str, str]:
        output = build(load_config(BuildConfig, embedded_args(tmp_path / "out", adapter, "caps.max_pairs=0")))
        data = load_from_disk(str(output))
        return {row["source_id"]: row["messages"][2]["content"] for split in data.values() for row in split}

    train_adapter(seed=0)
    first = answers_built()
    train_adapter(seed=1)
    second = answers_built()

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_ending_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, adapter).eval()
    rows = map(json.loads, (ROOT / "data_builders/embedded/requests.jsonl").open())
    requests = {row["id"]: row["request"] for row in rows}
    for source_id, answer in second.items():
        prompt = render_prompt(tiny_tokenizer, build_messages(requests[source_id]))
        ids = tiny_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        new = adapted.generate(input_ids=ids, max_new_tokens=24, do_sample=False, pad_token_id=tiny_tokenizer.pad_token_id,
                               eos_token_id=sorted(end_token_ids(tiny_tokenizer, adapted.generation_config)))
        assert answer == tiny_tokenizer.decode(new[0, ids.shape[1]:], skip_special_tokens=True).strip(), source_id
    assert second and first.keys() & second.keys() and any(first[k] != second[k] for k in first.keys() & second.keys())


def test_draft_refinement_triples(tmp_path, tiny_llama_dir, tiny_tokenizer, data_dir):
    args = [
        "recipe=code_draft_refinement",
        f"output_dir={tmp_path / 'out'}",
        f"model={tiny_llama_dir}",
        f"magicoder.path={data_dir / 'code_sft/magicoder_oss_instruct_75k_sample500.jsonl'}",
        "sources=[magicoder]",
        "magicoder.max_rows=40",
        "caps.max_pairs=24",
        "caps.max_pairs_per_request=3",
        "generation.max_new_tokens=16",
        "num_proc=1",
        "decontamination.benchmarks=[humaneval]",
    ]
    output = build(load_config(BuildConfig, args))
    data = load_from_disk(str(output))
    rows = list(data["train"]) + list(data.get("validation", []))
    assert len(rows) == 24
    assert set(data["train"].column_names) >= {"query", "draft", "response", "source_id", "prefix_index"}
    sample = data_dir / "code_sft/magicoder_oss_instruct_75k_sample500.jsonl"
    problems = {str(r["index"]): r for r in map(json.loads, sample.open())}
    for row in rows:
        problem = problems[row["source_id"]]
        steps = prefixes(segment_request(problem["problem"]))
        assert row["query"] == steps[row["prefix_index"] - 1] and row["response"] == problem["solution"]
        if row["prefix_index"] == 1:
            assert row["draft"] == ""
        else:
            previous = steps[row["prefix_index"] - 2]
            assert row["draft"] == cached_answer(tmp_path / "out.work", tiny_llama_dir, tiny_tokenizer, previous, 16)


def _cache_lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.is_file() else 0


def test_resume_after_killed_build_gives_the_same_bytes(tmp_path, tiny_qwen3_ending_dir):
    tiny_qwen3_dir = tiny_qwen3_ending_dir  # answers that end: some requests keep theirs
    output = tmp_path / "out"
    args = embedded_args(
        output, tiny_qwen3_dir, "embedded.max_rows=12", "generation.batch_size=1", "generation.max_new_tokens=32"
    )
    # reference: one uninterrupted build, then its output is moved away and its work dir removed
    build(load_config(BuildConfig, args))
    shutil.move(output, tmp_path / "reference")
    shutil.rmtree(tmp_path / "out.work")

    cache = cache_path(tmp_path / "out.work", str(tiny_qwen3_dir))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "data_builders", *args], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while _cache_lines(cache) < 3 and process.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done_before_kill = _cache_lines(cache)
    assert process.returncode == -signal.SIGKILL and 3 <= done_before_kill < 12
    assert not output.exists()  # nothing half-written where the trainer looks

    build(load_config(BuildConfig, args))
    assert tree_bytes(tmp_path / "reference") == tree_bytes(output)
    # answers finished before the kill were reused, not generated again
    assert len(AnswerCache(cache).answers) == _cache_lines(cache) == 12
    assert Report.load(output / "report.json").splits["train"]["rows"] > 0
