"""The bidirectional control: a fully bidirectional diffusion decoder (LLaDA-style
low-confidence remasking) and the same streaming verify-accept procedure.

The paper shows the procedure fails on bidirectional diffusion models (LLaDA-8B,
Dream-7B): their judgement of draft token j is formed at position j, by a network
that sees token j itself, so it approves what it sees. This engine runs any
standard transformers model with full attention (a 4D all-visible mask) to show
that failure next to the causal verifier (`python benchmarks/study_verifier.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from eval.engines.base import StreamingEngine, UpdateResult
from eval.engines.decode import DecodeSpec


def full_attention_mask(length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (1, 1, length, length) additive mask of zeros: every position sees every
    other. transformers passes a 4D mask through unchanged (masking_utils returns
    it as-is) and then runs SDPA with is_causal=False, so causality is really off.

    Args:
        length (int): the sequence's length.
        dtype (torch.dtype): the mask's dtype.
        device (torch.device): the mask's device.
    """
    return torch.zeros(1, 1, length, length, dtype=dtype, device=device)


@torch.inference_mode()
def bidirectional_logits(model: PreTrainedModel, token_ids: list[int], keep: int) -> torch.Tensor:
    """Float logits of the last `keep` positions of `token_ids` under full attention.

    Args:
        model (PreTrainedModel): the model.
        token_ids (list[int]): the sequence.
        keep (int): how many last positions' logits to return.
    """
    input_ids = torch.tensor([token_ids], device=model.device)
    mask = full_attention_mask(len(token_ids), model.dtype, model.device)
    output = model(input_ids=input_ids, attention_mask=mask, use_cache=False, logits_to_keep=keep)
    return output.logits[0].float()


@dataclass
class BidirectionalState:
    """Only the draft: a bidirectional model keeps no KV cache between updates."""

    draft: list[int] = field(default_factory=list)


class BidirectionalEngine(StreamingEngine):
    """Low-confidence remasking over a buffer of max_new_tokens masks, `steps`
    forwards for a full buffer (proportionally fewer for a shorter residue)."""

    def __init__(self, model: PreTrainedModel, mask_token_id: int, eos_token_ids: set[int], decode: DecodeSpec) -> None:
        super().__init__(model, eos_token_ids, decode)
        self.mask_token_id = mask_token_id
        self.steps = decode.diffusion_steps

    def new_state(self) -> BidirectionalState:
        return BidirectionalState()

    def forward(
        self, state: BidirectionalState, token_ids: list[int], phase: str | None, logits_to_keep: int = 1
    ) -> torch.Tensor:
        """One full-attention call over `token_ids`, counted under `phase`.

        Args:
            state (BidirectionalState): the request's decoding state.
            token_ids (list[int]): the whole sequence.
            phase (str | None): the phase the forward is counted and timed under, or None.
            logits_to_keep (int): how many last positions' logits to return.
        """
        logits = bidirectional_logits(self.model, token_ids, logits_to_keep)
        if phase:
            self.forwards[phase] += 1
        return logits

    def update(self, state: BidirectionalState, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        """Verify the draft in one full-attention forward (token j judged AT position
        j, seeing itself), keep the accepted leading run, remask the rest, denoise.

        Args:
            state (BidirectionalState): the request's decoding state.
            prompt_ids (list[int]): the prompt as known now, S_i.
            phases (tuple[str, str]): the phases the verify pass and the denoising are counted under.
        """
        verify_phase, regenerate_phase = phases
        clock, calls_before = self.stopwatch(), sum(self.forwards.values())
        draft, accepted = state.draft, 0
        if draft:
            logits = self.forward(state, prompt_ids + draft, verify_phase, logits_to_keep=len(draft))
            accepted = self.rule.accepted_length(logits, draft)
        answer = draft[:accepted]
        if not self.finished(answer):
            answer = self.denoise(prompt_ids, answer, regenerate_phase)
        state.draft = answer
        return self._result(answer, draft, accepted, calls_before, clock)

    def denoise(self, prompt_ids: list[int], prefix: list[int], phase: str) -> list[int]:
        """Fill the buffer after `prefix`: each step predicts every masked position
        and unmasks the most confident ones; the answer ends at its first EOS.

        Args:
            prompt_ids (list[int]): the prompt.
            prefix (list[int]): the answer tokens kept.
            phase (str): the phase the forwards are counted and timed under.
        """
        buffer = prefix + [self.mask_token_id] * (self.max_new_tokens - len(prefix))
        for count in self.schedule(self.max_new_tokens - len(prefix)):
            logits = self.forward(BidirectionalState(), prompt_ids + buffer, phase, logits_to_keep=len(buffer))
            confidence, tokens = torch.softmax(logits, dim=-1).max(dim=-1)
            masked = torch.tensor([token == self.mask_token_id for token in buffer], device=confidence.device)
            confidence[~masked] = -1.0
            for index in confidence.topk(count).indices.tolist():
                buffer[index] = int(tokens[index])
        for index, token in enumerate(buffer):
            if token in self.eos_token_ids:
                return buffer[: index + 1]
        return buffer

    def schedule(self, masked: int) -> list[int]:
        """Tokens unmasked per step: a full buffer takes `steps` steps, a residue of
        `masked` tokens the same share of them, spread as evenly as possible.

        Args:
            masked (int): how many tokens are masked.
        """
        steps = min(masked, max(1, math.ceil(self.steps * masked / self.max_new_tokens)))
        return [masked // steps + (1 if i < masked % steps else 0) for i in range(steps)]
