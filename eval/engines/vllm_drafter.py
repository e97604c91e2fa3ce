"""Drafting on vLLM (`backend=vllm`): the fast path's token work, the same tokens out.

Greedy drafts of all prefixes go to vLLM as one batch; under `threshold:TAU` each
round's verify passes are vLLM prompt log-probabilities over request + draft (one
call for all rows), and regeneration from the accepted prefixes is one batch. The
forwards are never vLLM's: `eval.engines.fast_path` computes them from the tokens,
with the functions the transformers path uses, so both backends count alike.
"""

from __future__ import annotations

from eval.engines.acceptance import AcceptanceRule
from eval.engines.tokens import through_first_eos
from headstart.vllm_client import VLLMEngines, vllm_dtype, vllm_model
from headstart.vllm_settings import VLLMSettings


class VLLMDrafter:
    """A `eval.engines.fast_path.Drafter` on vLLM engines."""

    def __init__(self, engines: VLLMEngines, eos_token_ids: set[int]) -> None:
        self.engines = engines
        self.eos_token_ids = eos_token_ids

    @classmethod
    def start(cls, model: str, adapter: str | None, settings: VLLMSettings, dtype: str | None, device: str,
              eos_token_ids: set[int], needed_model_len: int | None = None) -> VLLMDrafter:
        """Engines on `model` (with `adapter` through vLLM's LoRA), in the dtype transformers uses on `device`,
        with cache for `needed_model_len` tokens (headstart.vllm_client.needed_model_len; None: the model's).

        Args:
            model (str): the model source.
            adapter (str | None): a PEFT adapter directory for vLLM's LoRA, or None.
            settings (VLLMSettings): the run's vLLM settings.
            dtype (str | None): the run's dtype name, or None for the device's default.
            device (str): the device transformers runs on.
            eos_token_ids (set[int]): the ids that end an answer.
            needed_model_len (int | None): the longest prompt and answer the run sends, or None.
        """
        engines = VLLMEngines(vllm_model(model, adapter), settings, vllm_dtype(dtype, device), device, needed_model_len)
        return cls(engines, eos_token_ids)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        """Greedy answers from the vLLM engines, each ending at its first end (kept) or its budget.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            max_new_tokens (int | list[int]): the most tokens an answer may have: one for all prompts, or one per
                prompt.
        """
        answers = self.engines.generate(prompts, max_new_tokens, self.eos_token_ids)
        # The engines run without a tokenizer (ids in, ids out), so they know no stop strings: a base model's
        # answers decode on to an end token or the budget, and are cut here by the one end rule.
        return [through_first_eos(answer, self.eos_token_ids) for answer in answers]

    def accepted_lengths(self, prompts: list[list[int]], drafts: list[list[int]], rule: AcceptanceRule) -> list[int]:
        """Accepted length of each draft after its prompt, from vLLM's prompt log-probabilities.

        Args:
            prompts (list[list[int]]): the prompts' token ids.
            drafts (list[list[int]]): each prompt's draft.
            rule (AcceptanceRule): the acceptance rule.
        """
        rows = [i for i, draft in enumerate(drafts) if draft]  # an empty draft needs no verify pass
        scores = self.engines.token_scores([prompts[i] + drafts[i] for i in rows], [len(prompts[i]) for i in rows])
        lengths = [0] * len(drafts)
        for row, row_scores in zip(rows, scores):
            lengths[row] = rule.accepted_length_from_scores(row_scores)
        return lengths

    def close(self) -> None:
        self.engines.close()
