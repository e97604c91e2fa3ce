"""Greedy answers of a base model, in fixed batches, cached on disk.

Batches are fixed slices of the sorted prompt list, so a resumed run pads every
batch exactly as the uninterrupted run did and produces the same tokens. vLLM
(headstart.vllm_client, its own environment) is used when that environment exists
and a GPU is present, or when asked for; transformers otherwise. Both take the
same token ids and their answers are decoded by the same tokenizer, so one cache
serves both (they agree but for floating-point near-ties, as the vLLM backend's tests check).

Each answer is cached with whether it ended (`finished`: the model emitted its end
of turn) or was cut at `max_new_tokens`. A cut answer must not become a training
target: rendered as a complete turn it gains an end-of-turn the model never wrote,
and teaches it to stop early (data_builders/answers.py drops them).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from data_builders.answer_cache import AnswerCache, answer_key, model_identity
from data_builders.config import GenerationConfig
from headstart.completion import completion_frame, cut_at_stop
from headstart.devices import default_device
from headstart.models import end_token_ids, model_prompt_family
from headstart.paths import safe_name
from headstart.prompts import build_messages, render_prompt
from headstart.run_config import ModelSetting
from headstart.vllm_client import VLLMEngines, needed_model_len, vllm_dtype, vllm_model, vllm_unavailable

Generate = Callable[[list[str]], list[tuple[str, bool]]]  # prompts -> (answer, finished) each


@dataclass
class GenerationSettings(ModelSetting, GenerationConfig):
    """A build's `generation` section with the model it runs (the build's `model`)."""


def greedy_answers_finished(
    requests: list[str], settings: GenerationSettings, cache: AnswerCache, desc: str
) -> list[tuple[str, bool]]:
    """(greedy answer, whether it ended before max_new_tokens) for each request: the base
    model's answer to a plain user turn, no system message.

    Args:
        requests (list[str]): the user turns, in the order the answers come back.
        settings (GenerationSettings): the model, its backend, `max_new_tokens` and the batch size.
        cache (AnswerCache): the answers already generated; new ones are added to it.
        desc (str): the progress bar's label.
    """
    tokenizer = _tokenizer(settings.model)
    family = model_prompt_family(tokenizer, settings.prompt_format, settings.model)
    frame = completion_frame(settings.completion_frame)
    stop = frame.stop if family == "completion" else ()  # a base model's answer ends where its frame's text would go on
    prompts = [render_prompt(tokenizer, build_messages(r), family, frame=frame) for r in requests]
    identity = model_identity(settings.model)
    keys = [answer_key(identity, p, settings.max_new_tokens, stop) for p in prompts]
    unique = sorted(dict(zip(keys, prompts)).items(), key=lambda kv: (len(kv[1]), kv[0]))
    generate: Generate | None = None
    batches = [unique[i : i + settings.batch_size] for i in range(0, len(unique), settings.batch_size)]
    with ExitStack() as engines:  # vLLM's processes stop with the last batch
        for batch in tqdm(batches, desc=desc, unit="batch"):
            if all(key in cache for key, _ in batch):
                continue
            if generate is None:  # what is left to generate bounds the prompts vLLM reserves cache for
                pending = [prompt for later in batches if not all(key in cache for key, _ in later) for _, prompt in later]
                generate = _backend(settings, engines, pending, stop)
            outputs = [answer_at_stop(answer, done, stop) for answer, done in generate([prompt for _, prompt in batch])]
            cache.add([{"key": k, "model": settings.model, "answer": a, "finished": done}
                       for (k, _), (a, done) in zip(batch, outputs)])
    return [(cache.get(key), _finished(cache, key, tokenizer, settings.max_new_tokens)) for key in keys]


def answer_at_stop(answer: str, finished: bool, stop: tuple[str, ...]) -> tuple[str, bool]:
    """An answer cut before its first stop string, which ends it as an end token does.

    Args:
        answer (str): the decoded answer.
        finished (bool): whether it ended with an end token.
        stop (tuple[str, ...]): the stop strings (none: the answer as it is).
    """
    text, stopped = cut_at_stop(answer, stop)
    return (text.strip(), True) if stopped else (answer, finished)


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


def _backend(settings: GenerationSettings, engines: ExitStack, pending: list[str], stop: tuple[str, ...]) -> Generate:
    backend = settings.backend
    if backend == "auto":
        on_gpu = torch.cuda.is_available()  # auto: vLLM where it pays, a GPU with a GPU build of vLLM
        backend = "vllm" if on_gpu and vllm_unavailable(settings.vllm, "cuda") is None else "transformers"
    if backend == "vllm":
        return _vllm_backend(settings, engines, pending)
    if backend == "transformers":
        return _transformers_backend(settings, stop)
    raise ValueError(f"generation.backend must be auto, transformers or vllm, not {backend!r}")


def _transformers_backend(settings: GenerationSettings, stop: tuple[str, ...] = ()) -> Generate:
    from headstart.models import load_model

    loaded = load_model(settings.model, device=settings.device)
    tokenizer, model = loaded.tokenizer, loaded.model
    tokenizer.padding_side = "left"  # decoding continues from the right edge
    eos = end_token_ids(tokenizer, model.generation_config)

    @torch.inference_mode()
    def generate(prompts: list[str]) -> list[str]:
        batch = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt").to(model.device)
        output = model.generate(
            **batch,
            max_new_tokens=settings.max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=sorted(eos),  # stop where the vLLM path stops: any end token of the tokenizer or config
            **({"stop_strings": list(stop), "tokenizer": tokenizer} if stop else {}),  # an early exit; the cut is the caller's
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]
        # A row ended when it holds an end token; all rows end early when the batch is shorter than the cap.
        ends = torch.isin(new_tokens, torch.tensor(sorted(eos), device=new_tokens.device)).any(dim=1)
        short = new_tokens.shape[1] < settings.max_new_tokens
        return [(tokenizer.decode(t, skip_special_tokens=True).strip(), bool(short or end))
                for t, end in zip(new_tokens, ends.tolist())]

    return generate


def _vllm_backend(settings: GenerationSettings, engines: ExitStack, pending: list[str]) -> Generate:
    """vLLM engines on the model (an adapter directory through vLLM's LoRA), in the dtype the
    transformers path uses, with cache for the longest of the `pending` prompts and its answer;
    token ids in and out, encoded and decoded as the transformers path does."""
    from transformers import GenerationConfig

    tokenizer = _tokenizer(settings.model)
    model = vllm_model(settings.model)
    try:
        configured = GenerationConfig.from_pretrained(model.model_dir)
    except OSError:  # a model without generation_config.json: the tokenizer's EOS alone
        configured = None
    eos = end_token_ids(tokenizer, configured)
    device = settings.device or default_device()
    longest = max(len(ids) for ids in tokenizer(pending, add_special_tokens=False)["input_ids"])
    needed = needed_model_len(longest, settings.max_new_tokens)
    vllm = engines.enter_context(VLLMEngines(model, settings.vllm, vllm_dtype(None, device), device, needed))

    def generate(prompts: list[str]) -> list[tuple[str, bool]]:
        # Token ids, as the transformers path feeds them: the template already holds BOS.
        ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        answers = vllm.generate(ids, settings.max_new_tokens, eos)
        return [(tokenizer.decode(answer, skip_special_tokens=True).strip(), bool(answer) and answer[-1] in eos)
                for answer in answers]

    return generate


def cache_path(work_dir: Path, model: str) -> Path:
    """The writable cache of one model inside a build's work directory.

    Args:
        work_dir (Path): the build's work directory.
        model (str): the model's hub id or local path.
    """
    return Path(work_dir) / f"answers-{safe_name(model)}.jsonl"
