"""The autoregressive streaming engine: verify a draft in one forward, keep the
accepted prefix, regenerate the rest (PROTOCOL.md, "The procedure").

One `update` serves every case: the baseline is an update with no draft and an
empty cache, a drafting step is an update while the user is still typing, and
the residual phase is the update at submission. The KV cache of the request is
reused across updates: it is cropped to the longest common token prefix of what
it holds and what the next pass needs, so only new tokens are fed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from eval.engines.base import StreamingEngine, UpdateResult, common_prefix_length, crop_cache


@dataclass
class DecodeState:
    """What the engine holds for one request between updates."""

    cache: DynamicCache
    cached_ids: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)


class AREngine(StreamingEngine):
    """Greedy decoding with draft verification for one causal LM at batch size 1."""

    def new_state(self) -> DecodeState:
        return DecodeState(cache=DynamicCache(config=self.model.config))

    @torch.inference_mode()
    def forward(
        self, state: DecodeState, token_ids: list[int], phase: str | None, logits_to_keep: int = 1
    ) -> torch.Tensor:
        """Feed `token_ids` after the cached ones; logits of the last `logits_to_keep`
        positions. Counted under `phase` (None: set-up work outside any measurement)."""
        input_ids = torch.tensor([token_ids], device=self.model.device)
        output = self.model(
            input_ids=input_ids, past_key_values=state.cache, use_cache=True, logits_to_keep=logits_to_keep
        )
        if phase:
            self.forwards[phase] += 1
        state.cached_ids.extend(token_ids)
        return output.logits[0].float()

    def prime(self, state: DecodeState, prompt_ids: list[int], draft: list[int]) -> None:
        """Put the engine where it stands after drafting `draft` for `prompt_ids`
        (cache over prompt + draft minus its last token), without counting."""
        self.crop(state, 0)
        self.forward(state, prompt_ids + draft[:-1], phase=None)
        state.draft = list(draft)

    def update(self, state: DecodeState, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        """Verify the held draft against `prompt_ids`, accept, regenerate: the new draft."""
        verify_phase, regenerate_phase = phases
        start, calls_before = time.perf_counter(), sum(self.forwards.values())
        draft = state.draft
        sequence = prompt_ids + draft
        # Keep at least the last prompt token to feed: its logits judge draft token 0.
        reuse = min(common_prefix_length(state.cached_ids, sequence), len(prompt_ids) - 1)
        self.crop(state, reuse)
        logits = self.forward(state, sequence[reuse:], verify_phase, logits_to_keep=len(draft) + 1)
        accepted = self.rule.accepted_length(logits[:-1], draft)
        answer = draft[:accepted]
        if accepted < len(draft) or not self.finished(answer):
            self.crop(state, len(prompt_ids) + accepted)
            answer = self._regenerate(state, answer, logits[accepted], regenerate_phase)
        state.draft = answer
        return self._result(answer, draft, accepted, calls_before, start)

    def _regenerate(self, state: DecodeState, answer: list[int], logits: torch.Tensor, phase: str) -> list[int]:
        """Greedy decoding from the accepted prefix; the verify pass gave the first token."""
        answer = answer + [int(logits.argmax())]
        while not self.finished(answer):
            logits = self.forward(state, answer[-1:], phase)[-1]
            answer.append(int(logits.argmax()))
        return answer

    @staticmethod
    def crop(state: DecodeState, length: int) -> None:
        crop_cache(state.cache, state.cached_ids, length)
