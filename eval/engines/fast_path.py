"""The fast path: drafting (untimed, counted) decoded for many requests at once
in padded batches; only the timed parts (baseline and final update) run at batch 1.

- `greedy`: D_i = greedy(S_i), so the drafts of all prefixes are decoded in one
  batch, and each update's cost follows from them (k_i = common prefix of D_{i-1}
  and D_i tokens kept): max(1, L_i - k_i) with plain regeneration.
- any other rule: D_i depends on D_{i-1}, so update i of every request runs in one
  round: verify each draft (one forward), then regenerate from the accepted
  prefixes in one batch. An update costs max(1, L_i - a_i), a_i tokens accepted.

Regeneration is greedy under every rule, so the drafts do not depend on the
regeneration mode; with `lookup` an update's forwards are computed from the
tokens by `eval.engines.lookup.update_cost`, the rule the engine executes.

Under `greedy` every request also gets D_n = greedy(S_n) decoded in the same batch as
its drafts. A timed request compares it with its batch-1 baseline: the drafter's agreement,
what count mode rests on (batched, padded decoding need not give batch 1's tokens in bf16
or on vLLM). Count mode (`timed_every` > 1): for a request that is not timed every count of
its record follows from D_1..D_n: the residual update is the one from D_{n-1} to D_n, the
plain baseline costs len(D_n) forwards (PROTOCOL.md: 1 prefill, L-1 steps), the lookup
baseline the lookup decoder's forwards over D_n with the request as its only source.
Nothing of it is timed (its seconds are None), and its answers are not compared: the
streamed answer and the baseline are both D_n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from eval.engines.acceptance import AcceptanceRule
from eval.engines.ar import AREngine
from eval.engines.base import UpdateResult, new_cache
from eval.engines.decode import DecodeSpec
from eval.engines.lookup import update_cost
from eval.engines.tokens import answer_finished, common_prefix_length


@torch.inference_mode()
def batched_greedy(
    model: PreTrainedModel,
    prompts: list[list[int]],
    pad_token_id: int,
    eos_token_ids: set[int],
    max_new_tokens: int | list[int],
    batch_size: int = 16,
) -> list[list[int]]:
    """Greedy answers to several prompts, left-padded batches; each answer ends
    at its first EOS (kept) or at `max_new_tokens` (one for all, or one per prompt).
    Prompts are batched by length (less padding); answers come in the prompts' order.

    Args:
        model (PreTrainedModel): the model.
        prompts (list[list[int]]): the prompts' token ids.
        pad_token_id (int): the id that pads a batch's shorter prompts.
        eos_token_ids (set[int]): the ids that end an answer.
        max_new_tokens (int | list[int]): the most tokens an answer may have: one for all prompts, or one per prompt.
        batch_size (int): the most prompts a forward decodes.
    """
    budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch_answers = _greedy_batch(
            model, [prompts[i] for i in indices], pad_token_id, eos_token_ids, [budgets[i] for i in indices]
        )
        for index, answer in zip(indices, batch_answers):
            answers[index] = answer
    return answers


def _greedy_batch(
    model: PreTrainedModel, prompts: list[list[int]], pad_token_id: int, eos_token_ids: set[int], budgets: list[int]
) -> list[list[int]]:
    """One left-padded batch. A row that finishes leaves the batch (its cache rows
    too), so the step cost follows the rows still decoding, not the longest one."""
    width = max(len(p) for p in prompts)
    device = model.device
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    input_ids = torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts], device=device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(model)  # the engine's layout: the same numbers as the batch-1 updates
    answers: list[list[int]] = [[] for _ in prompts]
    active = list(range(len(prompts)))
    while True:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
        tokens = logits.argmax(-1).tolist()
        for row, token in zip(active, tokens):
            answers[row].append(token)
        keep = [i for i, row in enumerate(active) if not answer_finished(answers[row], eos_token_ids, budgets[row])]
        if not keep:
            return answers
        if len(keep) < len(active):
            kept = torch.tensor(keep, device=device)
            cache.batch_select_indices(kept)
            attention_mask, position_ids = attention_mask[kept], position_ids[kept]
            active = [active[i] for i in keep]
        input_ids = torch.tensor([[answers[row][-1]] for row in active], device=device)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(active), 1)], dim=1)
        position_ids = position_ids[:, -1:] + 1


class Drafter(Protocol):
    """What drafting's token work runs on (the transformers model, or vLLM: eval.engines.vllm_drafter).
    Forwards are never asked of it: they are computed from the tokens by `update_cost`."""

    def greedy(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        """Greedy answers, each ending at its first EOS (kept) or its budget, in the prompts' order.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            max_new_tokens (int | list[int]): the most tokens an answer may have: one for all prompts, or one per
                prompt.
        """

    def accepted_lengths(self, prompts: list[list[int]], drafts: list[list[int]], rule: AcceptanceRule) -> list[int]:
        """Accepted length of each draft after its prompt, by one verify pass each.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            drafts (list[list[int]]): each prompt's draft.
            rule (AcceptanceRule): the acceptance rule.
        """

    def close(self) -> None:
        """Release what the drafter holds (engine processes)."""


@dataclass
class TransformersDrafter:
    """Drafting on the transformers model: padded batches, one verify forward per draft."""

    model: PreTrainedModel
    pad_token_id: int
    eos_token_ids: set[int]
    batch_size: int  # EvalConfig.fast_batch_size

    def greedy(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        """`batched_greedy` on the drafter's model.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            max_new_tokens (int | list[int]): the most tokens an answer may have: one for all prompts, or one per
                prompt.
        """
        return batched_greedy(self.model, prompts, self.pad_token_id, self.eos_token_ids, max_new_tokens, self.batch_size)

    def accepted_lengths(self, prompts: list[list[int]], drafts: list[list[int]], rule: AcceptanceRule) -> list[int]:
        """Accepted length of each draft after its prompt, by one forward each.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            drafts (list[list[int]]): each prompt's draft.
            rule (AcceptanceRule): the acceptance rule.
        """
        return [verified_length(self.model, prompt, draft, rule) for prompt, draft in zip(prompts, drafts)]

    def close(self) -> None:
        pass


@dataclass
class Drafting:
    """What drafting left for the final update: D_1..D_{n-1}, and its forwards; under greedy
    acceptance also the drafter's own D_n = greedy(S_n) (`answer`, decoded in the drafts' batch):
    a counted request's every count follows from it, a timed one compares it with the batch-1 baseline."""

    drafts: list[list[int]]
    forwards: int
    answer: list[int] | None = None
    counted: bool = False  # counted from the drafts, not timed: its baseline is `answer`, never decoded apart


def greedy_update(answers: list[list[int]], prompts: list[list[int]], index: int, decode: DecodeSpec,
                  eos_token_ids: set[int]) -> UpdateResult:
    """Update `index` of a request under `greedy`, where D_i = greedy(S_i): it holds
    D_{index-1} (none at the first), keeps its common prefix with D_index and ends with
    D_index; its forwards computed from the tokens, untimed.

    Args:
        answers (list[list[int]]): the greedy answers D_1..D_n of the request's prompts.
        prompts (list[list[int]]): the request's prompts S_1..S_n.
        index (int): the update's index in them.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    held = answers[index - 1] if index else []
    answer = answers[index]
    accepted = common_prefix_length(held, answer)
    earlier = answers[: max(index - 1, 0)][::-1]
    forwards = update_cost(held, answer, accepted, earlier, prompts[index], decode, eos_token_ids)
    return UpdateResult(answer, len(held), accepted, forwards, None)


def greedy_drafting(
    drafts: list[list[int]], prompts: list[list[int]], decode: DecodeSpec, eos_token_ids: set[int],
    answer: list[int] | None = None, counted: bool = False,
) -> Drafting:
    """Drafting of one request under `greedy` (D_1..D_{n-1}); `answer`: the drafter's D_n (`counted`:
    the request is counted from it, not timed).

    Args:
        drafts (list[list[int]]): the greedy answers D_1..D_{n-1}.
        prompts (list[list[int]]): the request's prompts S_1..S_n.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
        answer (list[int] | None): the drafter's D_n, or None.
        counted (bool): whether the request is counted from `answer` rather than timed.
    """
    forwards = sum(greedy_update(drafts, prompts, index, decode, eos_token_ids).forwards for index in range(len(drafts)))
    return Drafting(drafts, forwards, answer, counted)


def counted_results(prompts: list[list[int]], drafting: Drafting, decode: DecodeSpec,
                    eos_token_ids: set[int]) -> tuple[UpdateResult, UpdateResult | None, UpdateResult]:
    """A request counted, not timed: its plain baseline, lookup baseline (None when
    regenerating plainly) and final update, from D_1..D_n alone.

    Args:
        prompts (list[list[int]]): the request's prompts S_1..S_n.
        drafting (Drafting): the request's drafting, with its answers.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    answer, prompt = drafting.answer, prompts[-1]
    baseline = UpdateResult(answer, 0, 0, len(answer), None)
    lookup = None
    if decode.lookup:
        lookup = UpdateResult(answer, 0, 0, update_cost([], answer, 0, [], prompt, decode, eos_token_ids), None)
    final = greedy_update([*drafting.drafts, answer], prompts, len(prompts) - 1, decode, eos_token_ids)
    return baseline, lookup, final


def round_drafts(drafter: Drafter, prompts: list[list[list[int]]], decode: DecodeSpec, eos_token_ids: set[int]) -> list[Drafting]:
    """Drafting under any rule for several requests (`prompts[r]` = S_1..S_{n-1}
    of request r): update i of every request in one round, verify each draft
    (one forward), then regenerate from the accepted prefixes in one batch.

    Args:
        drafter (Drafter): the drafter that answers and verifies.
        prompts (list[list[list[int]]]): for each request, its prompts S_1..S_{n-1}.
        decode (DecodeSpec): the decode settings.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    drafts: list[list[list[int]]] = [[] for _ in prompts]
    forwards = [0] * len(prompts)
    max_new_tokens = decode.max_new_tokens
    for step in range(max(len(p) for p in prompts)):
        rows = [r for r, request_prompts in enumerate(prompts) if step < len(request_prompts)]
        held = {r: drafts[r][-1] if drafts[r] else [] for r in rows}
        lengths = drafter.accepted_lengths([prompts[r][step] for r in rows], [held[r] for r in rows], decode.rule)
        accepted = dict(zip(rows, lengths))
        # A finished draft kept whole is the new draft: the verify pass alone.
        kept_whole = {r for r in rows if accepted[r] == len(held[r]) and answer_finished(held[r], eos_token_ids, max_new_tokens)}
        regenerate = [r for r in rows if r not in kept_whole]
        tails = drafter.greedy([prompts[r][step] + held[r][: accepted[r]] for r in regenerate],
                               [max_new_tokens - accepted[r] for r in regenerate])
        answers = {r: held[r] for r in rows} | {r: held[r][: accepted[r]] + tail for r, tail in zip(regenerate, tails)}
        for r in rows:
            earlier = drafts[r][:-1][::-1]
            forwards[r] += update_cost(held[r], answers[r], accepted[r], earlier, prompts[r][step], decode, eos_token_ids)
            drafts[r].append(answers[r])
    return [Drafting(request_drafts, request_forwards) for request_drafts, request_forwards in zip(drafts, forwards)]


@torch.inference_mode()
def verified_length(model: PreTrainedModel, prompt_ids: list[int], draft: list[int], rule: AcceptanceRule) -> int:
    """Accepted length of `draft` after `prompt_ids`, from one forward (none for an empty draft).

    Args:
        model (PreTrainedModel): the verifier.
        prompt_ids (list[int]): the prompt.
        draft (list[int]): the draft after it.
        rule (AcceptanceRule): the acceptance rule.
    """
    if not draft:
        return 0
    logits = model(input_ids=torch.tensor([prompt_ids + draft], device=model.device), logits_to_keep=len(draft) + 1).logits
    return rule.accepted_length(logits[0, :-1].float(), draft)


def final_update(engine: AREngine, prompts: list[list[int]], drafting: Drafting) -> UpdateResult:
    """The residual phase at batch size 1, from the state drafting left behind.

    Args:
        engine (AREngine): the engine that decodes the residual phase.
        prompts (list[list[int]]): the request's prompts S_1..S_n.
        drafting (Drafting): the request's drafting.
    """
    state = engine.new_state()
    engine.prime(state, prompts[-2], drafting.drafts[-1], earlier_drafts=drafting.drafts[:-1][::-1])
    return engine.update(state, prompts[-1], ("verify", "regenerate"))
