"""Pass 2: segment, hash, decontaminate and measure every request (datasets.map, num_proc).

The map adds only small columns (cut offsets, counts, codes), so the pass
stays cheap in memory however many requests there are.
"""

from __future__ import annotations

from typing import Any

from data_builders.decontamination import DecontaminationIndex, normalise, stable_hash
from headstart.completion import completion_frame
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, Family, build_messages, render_prompt
from headstart.segment import segment_request

# Bump when analyse_batch's columns change, the segmentation included (4: fenced
# blocks whole, MBPP asserts bare): it is part of the resume key of pass 2.
VERSION = 4

# contamination codes stored per request
CLEAN, EXACT, NGRAM = 0, 1, 2
CONTAMINATION_REASONS = {EXACT: "contaminated_exact", NGRAM: "contaminated_ngram"}


def cut_offsets(request: str, segments: list[str] | None = None) -> list[int]:
    """End offset of each segment; S_i = request[: offsets[i - 1]].

    Args:
        request (str): the request's text.
        segments (list[str] | None): its segments; None: cut by `segment_request`.
    """
    ends, total = [], 0
    for segment in segments or segment_request(request):
        total += len(segment)
        ends.append(total)
    return ends


def analyse_batch(
    batch: dict[str, list[Any]],
    index: DecontaminationIndex,
    tokenizer: Any | None,
    family: Family | None,
    frame: str | None = None,
) -> dict[str, list[Any]]:
    """Per request: segment ends, normalised-text hash, contamination code, token counts.

    Args:
        batch (dict[str, list[Any]]): a batch of collected requests, by column.
        index (DecontaminationIndex): the benchmark index that finds contaminated requests.
        tokenizer (Any | None): the tokenizer that counts tokens, or None to count none.
        family (Family | None): the prompt format the model reads (AR), or None for the bare query (ReFusion).
        frame (str | None): the completion frame's name (headstart.completion.FRAMES; None: the transcript).
    """
    requests, references = batch["request"], batch["reference"]
    cuts = [cut_offsets(r, s) for r, s in zip(requests, batch["segments"])]
    reasons = index.check_batch(requests, references)
    codes = [EXACT if r == "contaminated_exact" else NGRAM if r else CLEAN for r in reasons]
    out = {
        "cuts": cuts,
        "num_segments": [len(c) for c in cuts],
        "norm_hash": [stable_hash(normalise(r)) for r in requests],
        "contamination": codes,
        "has_reference": [bool(r and r.strip()) for r in references],
    }
    if tokenizer is not None:
        out["request_tokens"] = prompt_lengths(tokenizer, requests, family, frame)
        out["reference_tokens"] = text_lengths(tokenizer, [r or "" for r in references])
    return out


def prompt_lengths(tokenizer: Any, queries: list[str], family: Family | None, frame: str | None = None) -> list[int]:
    """Tokens of what the model reads: the rendered prompt (AR: a chat template, or a base model's
    completion format) or the bare query.

    Args:
        tokenizer (Any): the tokenizer that counts tokens.
        queries (list[str]): the queries the model reads.
        family (Family | None): the prompt format the model reads (AR), or None for the bare query (ReFusion).
        frame (str | None): the completion frame's name (headstart.completion.FRAMES; None: the transcript).
    """
    if family:
        framed = completion_frame(frame or "transcript")
        queries = [render_prompt(tokenizer, build_messages(q, system=INCOMPLETE_REQUEST_SYSTEM), family, frame=framed)
                   for q in queries]
    return text_lengths(tokenizer, queries)


def text_lengths(tokenizer: Any, texts: list[str]) -> list[int]:
    """Tokens of each text, without special tokens.

    Args:
        tokenizer (Any): the tokenizer that counts tokens.
        texts (list[str]): the texts to count.
    """
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
