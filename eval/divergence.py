"""Where two greedy answers to the same prompt part, and by how much the model preferred
one token over the other there: a gap within floating-point rounding (about 1e-5 in
fp32) is a near-tie two correct implementations may break differently; a large gap is a bug."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from eval.engines.base import common_prefix_length


@dataclass
class Divergence:
    """The first differing token of two answers and the one-pass logit gap there."""

    index: int
    expected: int
    other: int
    gap: float  # logit(expected) - logit(other), one forward over prompt + the common prefix


@torch.inference_mode()
def first_divergence(model: PreTrainedModel, prompt: list[int], expected: list[int], other: list[int]) -> Divergence | None:
    """The first token where `other` leaves `expected`, with its logit gap; None when one
    answer is a prefix of the other (no token where both chose)."""
    index = common_prefix_length(expected, other)
    if index >= min(len(expected), len(other)):
        return None
    logits = model(torch.tensor([prompt + expected[:index]], device=model.device)).logits[0, -1].float()
    return Divergence(index, expected[index], other[index], (logits[expected[index]] - logits[other[index]]).item())
