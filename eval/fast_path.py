"""The lossless fast path: in `greedy` mode D_i = greedy(S_i), so the drafts can
be decoded for all prefixes at once in a padded batch, and each update's cost
follows from them: max(1, L_i - k_i), k_i = common prefix of D_{i-1} and D_i.
Only the timed parts (baseline and final update) run at batch size 1.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from eval.ar_engine import AREngine, UpdateResult, common_prefix_length


@torch.inference_mode()
def batched_greedy(
    model: PreTrainedModel,
    prompts: list[list[int]],
    pad_token_id: int,
    eos_token_ids: set[int],
    max_new_tokens: int,
    batch_size: int = 16,
) -> list[list[int]]:
    """Greedy answers to several prompts, left-padded batches; each answer ends
    at its first EOS (kept) or at `max_new_tokens`. Prompts are batched by length
    (less padding) and the answers returned in the prompts' order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = [prompts[i] for i in indices]
        width = max(len(p) for p in batch)
        input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in batch], device=model.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos_token_ids),
            pad_token_id=pad_token_id,
        )
        for index, row in zip(indices, output):
            answers[index] = _until_eos(row[width:].tolist(), eos_token_ids)
    return answers


def update_costs(drafts: list[list[int]]) -> list[int]:
    """Forwards of each update when every draft is the greedy answer to its prefix."""
    previous: list[int] = []
    costs = []
    for draft in drafts:
        costs.append(max(1, len(draft) - common_prefix_length(previous, draft)))
        previous = draft
    return costs


def final_update(engine: AREngine, prompts: list[list[int]], last_draft: list[int]) -> UpdateResult:
    """The residual phase at batch size 1, from the state drafting left behind."""
    state = engine.new_state()
    engine.prime(state, prompts[-2], last_draft)
    return engine.update(state, prompts[-1], ("verify", "regenerate"))


def _until_eos(tokens: list[int], eos_token_ids: set[int]) -> list[int]:
    for index, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: index + 1]
    return tokens
