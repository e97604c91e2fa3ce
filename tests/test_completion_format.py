"""The completion format for base models: chosen on purpose (`prompt_format`), never a silent chat
wrapper; each benchmark's frame around every prefix; and stop strings as part of the one end rule,
so that the baseline, the stream and the counted path end every answer at the same token."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
import torch
from device_check.tiny_models import build_tiny_model, build_tiny_tokenizer

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.tokens import AnswerEnd, answer_finished, through_first_eos
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.completion import FRAMES, TRANSCRIPT, cut_at_stop, render_completion
from headstart.models import load_model, resolve_prompt_format
from headstart.prompts import build_messages, encode_prompt, prompt_family, read_training_record, write_training_record
from headstart.segment import prefixes

# Every count a record carries (tests/test_count_mode.py's), and the answers.
COUNTED = ("base_answer", "stream_answer", "base_tokens", "stream_tokens", "draft_tokens", "accepted_tokens",
           "baseline_forwards", "residual_forwards", "drafting_forwards", "lookup_baseline_forwards")


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory):
    """A tiny base model: its tokenizer has BOS and EOS of its own, no chat template, no ChatML tokens
    (heads of 32: vLLM's CPU attention has no kernel for smaller)."""
    tokenizer = build_tiny_tokenizer(tmp_path_factory.mktemp("base_tokenizer"), base=True)
    return build_tiny_model(tmp_path_factory.mktemp("tiny_base"), "llama", tokenizer, seed=3, head_dim=32)


def test_a_stop_string_ends_the_answer_at_the_token_that_completes_it(tiny_tokenizer):
    ids = tiny_tokenizer("    return x\ndef helper():\n    pass", add_special_tokens=False)["input_ids"]
    end = AnswerEnd({tiny_tokenizer.eos_token_id}, ("\ndef ",), tiny_tokenizer.decode)
    kept = end.stop_length(ids)
    assert "\ndef " in tiny_tokenizer.decode(ids[:kept]) and "\ndef " not in tiny_tokenizer.decode(ids[: kept - 1])
    assert through_first_eos(ids, end) == ids[:kept] and end.text(ids) == "    return x"
    assert answer_finished(ids[:kept], end, 100) and not answer_finished(ids[: kept - 1], end, 100)
    # An end token before the stop string ends the answer first; a plain set knows no stop strings.
    eos = tiny_tokenizer.eos_token_id
    assert through_first_eos(ids[:2] + [eos] + ids[2:], end) == ids[:2] + [eos]
    assert through_first_eos(ids, {eos}) == ids and end.text(ids[:2]) == tiny_tokenizer.decode(ids[:2])
    assert sorted(end) == [eos] and end == {eos}  # still the set of end ids every engine tests tokens against
    with pytest.raises(ValueError, match="stop strings need the tokenizer's decode"):
        AnswerEnd({eos}, ("\n",))


def test_each_benchmark_frames_every_prefix_whole():
    humaneval = BENCHMARKS["humaneval"].completion
    request = get_benchmark("humaneval").load(limit=1)[0]
    framed = [humaneval.prompt(known) for known in prefixes(request.segments)]
    # The chat instruction is left out, a partial one too; the code prefixes are true prefixes of the whole.
    assert framed[-1] == request.reference["prompt"] and framed[0] in ("", request.reference["prompt"][: len(framed[0])])
    assert all(framed[-1].startswith(text) for text in framed)
    mbpp = BENCHMARKS["mbpp"].completion
    assert mbpp.prompt("Write a function") == '"""\nWrite a function\n"""\n'  # closed around a partial request too
    assert BENCHMARKS["chat"].completion == TRANSCRIPT
    dialogue = build_messages("And now?", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                              system="Be brief.")
    expected = "<bos>Be brief.\n\nUser: Hi\nAssistant: Hello\nUser: And now?\nAssistant:"
    assert render_completion(dialogue, TRANSCRIPT, "<bos>") == expected


def test_a_base_model_gets_the_completion_format_on_purpose_only(base_model_dir, tmp_path):
    loaded = load_model(str(base_model_dir), device="cpu")
    with pytest.raises(ValueError, match="no chat template, and no ChatML tokens.*prompt_format=completion"):
        prompt_family(loaded.tokenizer, "chat", "tiny-base")
    with pytest.raises(ValueError, match="no chat template.*prompt_format=completion"):
        StreamingEvaluator(loaded, EvalConfig(model=str(base_model_dir)))  # auto: chat for a model the registry does not know
    with pytest.raises(ValueError, match="unknown prompt_format 'completions'"):
        EvalConfig(prompt_format="completions")
    assert resolve_prompt_format("auto", "gemma3-270m") == "completion"
    assert resolve_prompt_format("auto", "smollm2") == resolve_prompt_format("chat", "gemma3-270m") == "chat"
    write_training_record(tmp_path, {"prompt_format": "completion"})  # what training on a base model records
    assert resolve_prompt_format("auto", str(base_model_dir), adapter=str(tmp_path)) == "completion"
    ids = encode_prompt(loaded.tokenizer, build_messages("def f():"), "completion", BENCHMARKS["humaneval"].completion)
    assert ids[0] == loaded.tokenizer.bos_token_id and loaded.tokenizer.decode(ids[1:]) == "def f():"


def stops_from_answers(evaluator: StreamingEvaluator, requests) -> tuple[str, ...]:
    """Three characters from the middle of each answer without stop strings: stops the answers meet."""
    texts = [evaluator.end.text(evaluator.engine.baseline(evaluator.prompts(r)[-1]).answer) for r in requests]
    return tuple(text[len(text) // 2 : len(text) // 2 + 3] for text in texts if len(text) > 8)


def test_stop_strings_keep_the_stream_lossless_and_the_counts_exact(base_model_dir, monkeypatch):
    loaded = load_model(str(base_model_dir), device="cpu")
    requests = get_benchmark("humaneval").load(limit=5)

    def evaluator(engine: str, untimed: frozenset[str] = frozenset(), **config) -> StreamingEvaluator:
        decode = DecodeSpec(max_new_tokens=32, regenerate="lookup", engine=engine)
        config = EvalConfig(model="tiny-base", prompt_format="completion", decode=decode, **config)
        return StreamingEvaluator(loaded, config, untimed=untimed)

    stops = stops_from_answers(evaluator("stepwise"), requests)
    assert len(stops) >= 3
    frame = replace(BENCHMARKS["humaneval"].completion, stop=stops)
    monkeypatch.setitem(BENCHMARKS, "humaneval", replace(BENCHMARKS["humaneval"], completion=frame))
    stepwise = evaluator("stepwise", record_tokens=True)
    counting = evaluator("auto", frozenset(r.request_id for r in requests), fast_batch_size=8)
    assert stepwise.end.stop_strings == stops
    counted = [record for group in counting.request_groups(requests) for record in counting.evaluate_many(group)]
    stopped = 0
    for request, record in zip(requests, counted):
        executed = stepwise.evaluate(request)
        assert executed["identical"] is True, request.request_id  # streamed == baseline, token for token
        assert {k: record[k] for k in COUNTED} == {k: executed[k] for k in COUNTED}, request.request_id
        assert not any(stop in executed["base_answer"] for stop in stops)
        for tokens in (executed["base_token_ids"], executed["stream_token_ids"]):  # ended at the completing token
            assert stepwise.end.stop_length(tokens) in (None, len(tokens)), request.request_id
        stopped += executed["base_tokens"] < 32
    assert stopped >= 3, "the stop strings ended answers before the cap: the case is exercised"


def test_a_base_model_trains_on_transcripts_and_its_adapter_is_evaluated_as_it_trained(base_model_dir, tmp_path):
    from test_train_support import (
        ONE_PROCESS,
        REPO,
        launch,
        launch_command,
        launch_env,
        step_losses,
        tiny_overrides,
        write_dataset_dict,
    )

    from train.tokenization import split_prompt_answer

    tokenizer = load_model(str(base_model_dir), device="cpu").tokenizer
    prompt, answer = split_prompt_answer(tokenizer, build_messages("Sum a list.") + [
        {"role": "assistant", "content": "def f(x): return sum(x)"}], "completion")
    assert (prompt, answer) == ("<bos>User: Sum a list.\nAssistant:", " def f(x): return sum(x)<eos>")
    out = tmp_path / "run"
    overrides = tiny_overrides(base_model_dir, write_dataset_dict(tmp_path / "data"), out, max_steps=4, save_steps=4)
    # prompt_format=auto: chat, for a model the embedded registry does not know; it has no chat format.
    failed = subprocess.run(launch_command(ONE_PROCESS, ["recipe=smollm2_prefix", *overrides]), cwd=REPO,
                            env=launch_env(), capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0 and "prompt_format=completion" in failed.stderr, failed.stderr[-2000:]
    launch(ONE_PROCESS, ["recipe=smollm2_prefix", "model.prompt_format=completion", *overrides])
    assert sorted(step_losses(out)) == [1, 2, 3, 4]
    assert read_training_record(out / "adapter")["prompt_format"] == "completion"
    assert resolve_prompt_format("auto", str(base_model_dir), adapter=str(out / "adapter")) == "completion"


@pytest.mark.slow
def test_vllm_drafting_ends_answers_by_the_same_rule(base_model_dir, monkeypatch):
    """vLLM's engines run without a tokenizer and know no stop strings: their answers are cut by the one
    end rule, so the counted records equal those drafted on transformers."""
    from headstart.vllm_client import vllm_unavailable

    if vllm_unavailable():
        pytest.skip(f"vLLM backend not testable: {vllm_unavailable()}")
    loaded = load_model(str(base_model_dir), device="cpu")
    requests = get_benchmark("humaneval").load(limit=4)
    decode = DecodeSpec(max_new_tokens=24, regenerate="lookup")
    untimed = frozenset(r.request_id for r in requests)

    def evaluator(**config) -> StreamingEvaluator:
        config = EvalConfig(model=str(base_model_dir), prompt_format="completion", decode=decode, **config)
        return StreamingEvaluator(loaded, config, untimed=untimed)

    stops = stops_from_answers(evaluator(), requests)
    frame = replace(BENCHMARKS["humaneval"].completion, stop=stops)
    monkeypatch.setitem(BENCHMARKS, "humaneval", replace(BENCHMARKS["humaneval"], completion=frame))
    on_transformers = evaluator().evaluate_many(requests)
    on_vllm_evaluator = evaluator(backend="vllm")
    try:
        on_vllm = on_vllm_evaluator.evaluate_many(requests)
    finally:
        on_vllm_evaluator.close()
    assert sum(r["base_tokens"] < 24 for r in on_transformers) >= 2, "stop strings ended answers: the case is exercised"
    for by_transformers, by_vllm in zip(on_transformers, on_vllm):
        assert by_vllm["drafting_backend"] == "vllm"
        assert {k: by_vllm[k] for k in COUNTED} == {k: by_transformers[k] for k in COUNTED}, by_vllm["request_id"]


def test_self_distillation_prompts_a_base_model_as_a_transcript(base_model_dir, tmp_path):
    from data_builders.answer_cache import AnswerCache
    from data_builders.generation import GenerationSettings, answer_at_stop, greedy_answers_finished

    assert answer_at_stop("Sure.\nUser: and then?", False, TRANSCRIPT.stop) == ("Sure.", True)  # the next turn ends it
    assert answer_at_stop("cut at the cap", False, TRANSCRIPT.stop) == ("cut at the cap", False)
    requests = [r.text for r in get_benchmark("humaneval").load(limit=3)]
    chat = GenerationSettings(model=str(base_model_dir), max_new_tokens=12, backend="transformers", device="cpu")
    with pytest.raises(ValueError, match="prompt_format=completion"):
        greedy_answers_finished(requests, chat, AnswerCache(tmp_path / "chat.jsonl"), desc="chat")
    settings = replace(chat, prompt_format="completion")
    answers = greedy_answers_finished(requests, settings, AnswerCache(tmp_path / "cache.jsonl"), desc="completion")
    # The answers are the model's greedy continuations of the transcript, decoded as the evaluator decodes them.
    loaded = load_model(str(base_model_dir), device="cpu")
    for request, (answer, finished) in zip(requests, answers):
        ids = encode_prompt(loaded.tokenizer, build_messages(request), "completion")
        output = loaded.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):]
        assert answer == loaded.tokenizer.decode(output, skip_special_tokens=True).strip() and not finished


@pytest.fixture(scope="module")
def ending_base_model_dir(base_model_dir, tmp_path_factory):
    """The tiny base model made to end its answers: its EOS row of the output layer is the row of
    the token its greedy answers write most, scaled up by 0.1%, so some answers end early and
    others run to a small cap (tests/conftest.py's tiny_qwen3_ending_dir, for a base model)."""
    from collections import Counter

    from transformers import AutoModelForCausalLM

    loaded = load_model(str(base_model_dir), device="cpu")
    written = Counter()
    for request in [r.text for r in get_benchmark("mbpp", "data/mbpp/mbpp.jsonl").load(limit=4)]:
        ids = encode_prompt(loaded.tokenizer, build_messages(request), "completion", frame=FRAMES["docstring"])
        written.update(loaded.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist())
    often = next(t for t, _ in written.most_common() if t not in loaded.tokenizer.all_special_ids)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight[loaded.tokenizer.eos_token_id] = model.lm_head.weight[often] * 1.001
    directory = tmp_path_factory.mktemp("tiny_base_ending")
    model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)
    return directory


def test_rows_built_in_a_benchmark_frame_train_on_the_prompt_the_benchmark_evaluates(ending_base_model_dir, tmp_path):
    """A base model's self-distilled rows written in MBPP's frame (`generation.completion_frame`):
    each answer is the model's greedy continuation of the framed request, cut at the frame's stop
    strings, and training tokenizes each row's prompt exactly as the evaluator prompts that prefix."""
    from datasets import load_from_disk

    from data_builders.build import build
    from data_builders.config import BuildConfig
    from headstart.config import RecipeError, load_config
    from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM
    from train.tokenization import tokenize_example

    args = ["recipe=embedded_prefix", f"model={ending_base_model_dir}", "generation.cache_files=[]",
            "generation.max_new_tokens=24", "generation.prompt_format=completion", "decontamination.benchmarks=[humaneval]",
            "caps.max_pairs=30"]
    with pytest.raises(RecipeError, match="unknown completion frame 'docstrings'; known: transcript, function"):
        build(load_config(BuildConfig, [*args, "generation.completion_frame=docstrings", f"output_dir={tmp_path / 'x'}"]))
    output = build(load_config(BuildConfig, [*args, "generation.completion_frame=docstring", f"output_dir={tmp_path / 'o'}"]))
    data = load_from_disk(str(output))
    rows = list(data["train"]) + list(data.get("validation", []))
    assert rows and {row["frame"] for row in rows} == {"docstring"}
    loaded = load_model(str(ending_base_model_dir), device="cpu")
    tokenizer, frame = loaded.tokenizer, BENCHMARKS["mbpp"].completion
    assert frame is FRAMES["docstring"]
    for row in rows[:6]:
        # The answer: greedy decoding of the complete request in the frame, cut before a stop string.
        ids = encode_prompt(tokenizer, build_messages(row["full_request"]), "completion", frame=frame)
        output_ids = loaded.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        text = tokenizer.decode(output_ids, skip_special_tokens=True)
        assert row["messages"][2]["content"] in (text, cut_at_stop(text, frame.stop)[0].strip())
        # Training's prompt for the row is the evaluator's prompt for that prefix in MBPP's frame.
        parts = tokenize_example(row, tokenizer, "completion", INCOMPLETE_REQUEST_SYSTEM)
        evaluated = encode_prompt(tokenizer, build_messages(row["messages"][1]["content"], system=INCOMPLETE_REQUEST_SYSTEM),
                                  "completion", frame=frame)
        prompt_length = parts["completion_mask"].index(1)
        assert parts["input_ids"][:prompt_length] == evaluated
        assert parts["input_ids"][-1] == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="unknown completion frame 'nope'"):
        tokenize_example({**rows[0], "frame": "nope"}, tokenizer, "completion", INCOMPLETE_REQUEST_SYSTEM)
