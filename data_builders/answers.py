"""Answers and drafts for the chosen requests: the corpus's own, or the model's greedy ones.

A self-distilled answer that reached `generation.max_new_tokens` without ending is
dropped with its request (reason `answer_hit_token_cap`, counted in the report and
the card): kept, it would be trained as a complete turn and teach early stopping.
Drafts are context, never targets, and a draft cut at the cap is what the evaluator
holds too: they are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from datasets import Dataset

from data_builders.answer_cache import AnswerCache
from data_builders.config import BuildConfig
from data_builders.generation import GenerationSettings, cache_path, greedy_answers_finished
from data_builders.select import Selection
from headstart.paths import resolve_path

Answers = dict[int, str | None]  # analysed row -> answer to the complete request (None: cut at the token cap)
Drafts = dict[tuple[int, int], str]  # (analysed row, i) -> answer to S_(i-1)


def gather(analysed: Dataset, selection: Selection, config: BuildConfig, work: Path) -> tuple[Answers | None, Drafts | None]:
    """Generated answers per chosen row (None: references, read later from the data),
    and drafts per (row, i) for draft-refinement.

    Args:
        analysed (Dataset): the analysed requests.
        selection (Selection): the chosen requests.
        config (BuildConfig): the build's settings.
        work (Path): the build's work directory, which holds the answer cache.
    """
    if config.answers == "reference" and config.pairs != "draft_refinement":
        return None, None
    chosen = selection.rows()
    subset = analysed.select(chosen)
    settings = GenerationSettings(
        model=config.model,
        max_new_tokens=config.generation.max_new_tokens,
        batch_size=config.generation.batch_size,
        backend=config.generation.backend,
        device=config.generation.device,
        vllm=config.generation.vllm,
        prompt_format=config.generation.prompt_format,
        completion_frame=config.generation.completion_frame,
    )
    cache = AnswerCache(cache_path(work, config.model), [resolve_path(p) for p in config.generation.cache_files])
    requests, rows = subset["request"], chosen.tolist()
    refine = config.pairs == "draft_refinement"
    full = list(requests) if config.answers == "self" else []
    wanted = [
        (row, i, request[: cuts[i - 2]])
        for row, request, cuts in zip(rows, requests, subset["cuts"])
        for i in selection.prefixes(row, len(cuts))
        if i > 1
    ] if refine else []
    # One call for answers and drafts: one engine start, one length-sorted batching.
    generated = greedy_answers_finished(full + [w[2] for w in wanted], settings, cache, desc="self-distil answers and drafts")
    answers = {row: answer if finished else None for row, (answer, finished) in zip(rows, generated)} if full else None
    drafts = {(row, i): text for (row, i, _), (text, _) in zip(wanted, generated[len(full):])} if refine else None
    return answers, drafts


def has_answer(analysed: Dataset, chosen: np.ndarray, answers: Answers | None) -> np.ndarray:
    """Which chosen requests have a usable answer (empty and cut ones are excluded).

    Args:
        analysed (Dataset): the analysed requests.
        chosen (np.ndarray): row numbers of the chosen requests.
        answers (Answers | None): generated answers by row; None: the corpus's own references, all usable.
    """
    if answers is not None:
        return np.array([bool(answers[int(row)] and answers[int(row)].strip()) for row in chosen], dtype=bool)
    return analysed.data.column("has_reference").to_numpy(zero_copy_only=False)[chosen]


def cut_answers(chosen: np.ndarray, answers: Answers | None) -> int:
    """How many chosen requests lost their answer to the token cap.

    Args:
        chosen (np.ndarray): row numbers of the chosen requests.
        answers (Answers | None): generated answers by row (None where cut at the token cap); None: the corpus's own
            references.
    """
    return 0 if answers is None else sum(answers[int(row)] is None for row in chosen)
