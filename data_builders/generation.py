"""Greedy answers of a base model, in fixed batches, cached on disk.

Batches are fixed slices of the sorted prompt list, so a resumed run pads every
batch exactly as the uninterrupted run did and produces the same tokens. vLLM
is used when it is installed and a GPU is present; transformers otherwise.

Each answer is cached with whether it ended (`finished`: the model emitted its end
of turn) or was cut at `max_new_tokens`. A cut answer must not become a training
target: rendered as a complete turn it gains an end-of-turn the model never wrote,
and teaches it to stop early (data_builders/answers.py drops them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from data_builders.answer_cache import AnswerCache, answer_key
from headstart.prompts import build_messages, render_prompt

Generate = Callable[[list[str]], list[tuple[str, bool]]]  # prompts -> (answer, finished) each


@dataclass
class GenerationSettings:
    model: str
    max_new_tokens: int
    batch_size: int
    backend: str = "auto"
    device: str | None = None


def greedy_answers(requests: list[str], settings: GenerationSettings, cache: AnswerCache, desc: str) -> list[str]:
    """The base model's greedy answer to each request (a plain user turn, no system message)."""
    return [answer for answer, _ in greedy_answers_finished(requests, settings, cache, desc)]


def greedy_answers_finished(
    requests: list[str], settings: GenerationSettings, cache: AnswerCache, desc: str
) -> list[tuple[str, bool]]:
    """(greedy answer, whether it ended before max_new_tokens) for each request."""
    tokenizer = _tokenizer(settings.model)
    prompts = [render_prompt(tokenizer, build_messages(r)) for r in requests]
    keys = [answer_key(settings.model, p, settings.max_new_tokens) for p in prompts]
    unique = sorted(dict(zip(keys, prompts)).items(), key=lambda kv: (len(kv[1]), kv[0]))
    generate: Generate | None = None
    batches = [unique[i : i + settings.batch_size] for i in range(0, len(unique), settings.batch_size)]
    for batch in tqdm(batches, desc=desc, unit="batch"):
        if all(key in cache for key, _ in batch):
            continue
        generate = generate or _backend(settings)
        outputs = generate([prompt for _, prompt in batch])
        cache.add([{"key": k, "model": settings.model, "answer": a, "finished": done}
                   for (k, _), (a, done) in zip(batch, outputs)])
    return [(cache.get(key), _finished(cache, key, tokenizer, settings.max_new_tokens)) for key in keys]


def _finished(cache: AnswerCache, key: str, tokenizer, max_new_tokens: int) -> bool:
    """The cached flag; for an answer cached before flags existed, judged by its length: one
    that re-tokenizes to max_new_tokens - 1 tokens or more is taken as cut (decoding and
    re-encoding can differ by a few tokens, so a cut answer may pass: regenerate to be sure)."""
    finished = cache.finished(key)
    if finished is not None:
        return finished
    return len(tokenizer(cache.get(key), add_special_tokens=False)["input_ids"]) < max_new_tokens - 1


_TOKENIZERS: dict = {}


def _tokenizer(model: str):
    if model not in _TOKENIZERS:
        from headstart.models import load_tokenizer

        _TOKENIZERS[model] = load_tokenizer(model)
    return _TOKENIZERS[model]


def _backend(settings: GenerationSettings) -> Generate:
    backend = settings.backend
    if backend == "auto":
        has_vllm = importlib.util.find_spec("vllm") is not None
        backend = "vllm" if has_vllm and torch.cuda.is_available() else "transformers"
    if backend == "vllm":
        return _vllm_backend(settings)
    if backend == "transformers":
        return _transformers_backend(settings)
    raise ValueError(f"generation.backend must be auto, transformers or vllm, not {backend!r}")


def _transformers_backend(settings: GenerationSettings) -> Generate:
    from headstart.models import load_model

    loaded = load_model(settings.model, device=settings.device)
    tokenizer, model = loaded.tokenizer, loaded.model
    tokenizer.padding_side = "left"  # decoding continues from the right edge
    configured = model.generation_config.eos_token_id
    eos = {tokenizer.eos_token_id, *(configured if isinstance(configured, (list, tuple)) else [configured])} - {None}

    @torch.inference_mode()
    def generate(prompts: list[str]) -> list[str]:
        batch = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt").to(model.device)
        output = model.generate(
            **batch,
            max_new_tokens=settings.max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        # A row ended when it holds an end token; all rows end early when the batch is shorter than the cap.
        ends = torch.isin(new_tokens, torch.tensor(sorted(eos), device=new_tokens.device)).any(dim=1)
        short = new_tokens.shape[1] < settings.max_new_tokens
        return [(tokenizer.decode(t, skip_special_tokens=True).strip(), bool(short or end))
                for t, end in zip(new_tokens, ends.tolist())]

    return generate


def _vllm_backend(settings: GenerationSettings) -> Generate:
    from vllm import LLM, SamplingParams

    from headstart.models import resolve_model_dir

    tokenizer = _tokenizer(settings.model)
    llm = LLM(model=resolve_model_dir(settings.model), seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=settings.max_new_tokens)

    def generate(prompts: list[str]) -> list[str]:
        # Token ids, as the transformers path feeds them: the template already holds BOS.
        ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        outputs = llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)
        return [(out.outputs[0].text.strip(), out.outputs[0].finish_reason != "length") for out in outputs]

    return generate


def cache_path(work_dir: Path, model: str) -> Path:
    """The writable cache of one model inside a build's work directory."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[-80:]
    return Path(work_dir) / f"answers-{safe}.jsonl"
