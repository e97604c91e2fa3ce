"""Pass 4: expand chosen requests into training rows (datasets.map, batched, num_proc).

prefix-to-answer: one row per kept prefix S_i with the answer to the complete
request. draft-refinement adds `draft`, the model's answer to S_{i-1} ("" for
i = 1). AR rows are TRL conversational `messages`; ReFusion rows are
`query`/`response`. Every row carries its provenance (`answer_model`: the model
that wrote a self-distilled answer, null for the corpus's own), and `full_request`,
the complete request S_n its prefix S_i is cut from (`objective: distill` prompts the
teacher with it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from data_builders.analyse import prompt_lengths, text_lengths
from data_builders.select import Selection
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, Family

PROVENANCE = ["source", "source_id", "prefix_index", "num_segments", "answer_kind", "answer_model", "full_request"]
STAT_COLUMNS = ["_prompt_tokens", "_answer_tokens", "_draft_tokens"]


def expand_batch(
    batch: dict[str, list[Any]],
    indices: list[int],
    rows: np.ndarray,
    selection: Selection,
    answers: dict[int, str] | None,
    drafts: dict[tuple[int, int], str] | None,
    fmt: str,
    answer_kind: str,
    tokenizer: Any | None,
    answer_model: str | None = None,
    family: Family | None = None,
    frame: str = "transcript",
) -> dict[str, list[Any]]:
    """Rows for one batch of chosen requests; `indices` are positions in `rows`. `answers` holds generated
    answers by row; None: the corpus's own reference, read from the batch (a large build never holds them all).

    Args:
        rows (np.ndarray): row numbers of the chosen requests.
        drafts (dict[tuple[int, int], str] | None): the model's answers to S_(i-1) by (row, i), for draft-refinement.
        fmt (str): the rows' format ("ar" or "refusion").
        tokenizer (Any | None): the tokenizer that counts prompt tokens, or None to count none.
        family (Family | None): the prompt format an AR model reads (token counts of its prompts).
        frame (str): the completion frame (headstart.completion.FRAMES) of a base model's rows (family "completion").
    """
    out: dict[str, list[Any]] = {k: [] for k in PROVENANCE}
    queries, responses, draft_texts = [], [], []
    for k, position in enumerate(indices):
        row = int(rows[position])
        answer = answers[row] if answers is not None else batch["reference"][k] or ""
        if not answer or not answer.strip():
            continue  # empty answers (PROTOCOL) and answers cut at the token cap are excluded; counted by the builder
        request, cuts = batch["request"][k], batch["cuts"][k]
        for i in selection.prefixes(row, len(cuts)):
            queries.append(request[: cuts[i - 1]])
            responses.append(answer)
            if drafts is not None:
                draft_texts.append(drafts[(row, i)] if i > 1 else "")
            out["source"].append(batch["source"][k])
            out["source_id"].append(batch["source_id"][k])
            out["prefix_index"].append(i)
            out["num_segments"].append(len(cuts))
            out["answer_kind"].append(answer_kind)
            out["answer_model"].append(answer_model)
            out["full_request"].append(request[: cuts[-1]])  # S_n (byte-identical to the request)
    if fmt == "ar":
        out["messages"] = [_messages(q, a) for q, a in zip(queries, responses)]
        if family == "completion":  # training renders each row's request in this frame
            out["frame"] = [frame] * len(queries)
    else:
        out["query"], out["response"] = queries, responses
        if drafts is not None:
            out["draft"] = draft_texts
    if tokenizer is not None:
        out["_prompt_tokens"] = prompt_lengths(tokenizer, queries, family if fmt == "ar" else None, frame)
        out["_answer_tokens"] = text_lengths(tokenizer, responses)
        if drafts is not None:
            out["_draft_tokens"] = text_lengths(tokenizer, draft_texts)
    return out


def _messages(query: str, answer: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM},
        {"role": "user", "content": query},
        {"role": "assistant", "content": answer},
    ]
