"""What every streaming engine shares: the result of one update, the replay of a
request, and the baseline as an update with no draft (PROTOCOL.md, "The procedure").

An engine (autoregressive, ReFusion, bidirectional) provides `new_state()` and
`update(state, prompt_ids, phases)`; the replay and the baseline follow from them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from eval.engines.clock import Stopwatch
from eval.engines.decode import DecodeSpec
from eval.engines.tokens import answer_finished


@dataclass
class UpdateResult:
    """One verify-accept-regenerate step."""

    answer: list[int]
    draft_length: int
    accepted: int
    forwards: int
    seconds: float | None  # None: counted from tokens decoded in a batch, not timed (the fast path's count mode)


@dataclass
class StreamResult:
    """Every update of one streamed request; the last one is the residual phase."""

    steps: list[UpdateResult]

    @property
    def final(self) -> UpdateResult:
        return self.steps[-1]

    @property
    def drafting_forwards(self) -> int:
        return sum(step.forwards for step in self.steps[:-1])


def decoder_config(model: PreTrainedModel) -> PretrainedConfig:
    """The config of `model`'s text decoder, the one home of every mask and cache decision: a
    multimodal model (Gemma3ForConditionalGeneration, as gemma-3-12b-it loads) keeps
    `layer_types` and `sliding_window` in its `text_config` only, a causal LM at its top.

    Args:
        model (PreTrainedModel): the loaded model.
    """
    return model.config.get_text_config(decoder=True)


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """The KV cache of every engine: the layers `model`'s config asks for, except that a
    sliding-window (or chunked) layer keeps every past state, so `crop_cache` can cut it
    back to any length. transformers' sliding layers drop states older than the window,
    and cannot be cropped once it is full (Gemma-3). The model's attention mask still
    limits a sliding layer to its window: sized against a full-length layer, it is the
    mask of a forward with no cache.

    Args:
        model (PreTrainedModel): the model the cache serves.
    """
    cache = DynamicCache(config=decoder_config(model))
    cache.layers = [
        DynamicLayer() if isinstance(layer, DynamicLayer) and getattr(layer, "is_sliding", False) else layer
        for layer in cache.layers
    ]
    return cache


def crop_cache(cache: DynamicCache, held: list, length: int) -> None:
    """Cut a KV cache and the list of what it holds (token ids, or token-position
    pairs) back to their first `length` entries.

    Args:
        cache (DynamicCache): the KV cache.
        held (list): what the cache holds, entry by entry.
        length (int): how many entries to keep.
    """
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)
    del held[length:]


def keep_cache_positions(cache: DynamicCache, positions: list[int]) -> None:
    """Keep only the cache entries at `positions` (in order): the accepted branch of a token tree.

    Args:
        cache (DynamicCache): the KV cache.
        positions (list[int]): the entries to keep.
    """
    index = torch.tensor(positions, device=cache.layers[0].keys.device)
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)


def append_to_cache(cache: DynamicCache, layer_states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Append KV states computed elsewhere (another batch row, say) after each layer's cached entries.

    Args:
        cache (DynamicCache): the KV cache, one batch row.
        layer_states (list[tuple[torch.Tensor, torch.Tensor]]): per layer, (keys, values) of shape
            (1, heads, entries, head_dim).
    """
    for layer, (keys, values) in zip(cache.layers, layer_states, strict=True):
        layer.keys = torch.cat([layer.keys, keys], dim=-2)
        layer.values = torch.cat([layer.values, values], dim=-2)


def set_cache_batch(cache: DynamicCache, rows: int) -> None:
    """Give the cache `rows` identical batch rows (it holds one shared context).

    Args:
        cache (DynamicCache): the KV cache, one batch row.
        rows (int): the batch rows it gets.
    """
    current = cache.layers[0].keys.shape[0]
    if rows > current:
        if current != 1:
            cache.batch_select_indices(torch.tensor([0]))
        cache.batch_repeat_interleave(rows)
    elif rows < current:
        cache.batch_select_indices(torch.arange(rows))


class StreamingEngine:
    """The replay and the baseline, in terms of a subclass's `new_state` and `update`."""

    # A fully accepted draft that ends in EOS costs the verification pass alone.
    min_residual_forwards = 1

    def __init__(self, model: PreTrainedModel, eos_token_ids: set[int], decode: DecodeSpec) -> None:
        self.model = model
        self.eos_token_ids = eos_token_ids
        self.spec = decode
        self.max_new_tokens = decode.max_new_tokens
        self.rule = decode.rule
        self.forwards: Counter[str] = Counter()  # model calls by phase

    def stopwatch(self) -> Stopwatch:
        """Start timing a phase on the model's device (`decode.timing` on CUDA)."""
        return Stopwatch(self.model.device, self.spec.timing)

    def finished(self, answer: list[int]) -> bool:
        """Whether `answer` is finished: it ends with an EOS, or reached the token budget.

        Args:
            answer (list[int]): the answer's token ids.
        """
        return answer_finished(answer, self.eos_token_ids, self.max_new_tokens)

    def new_state(self) -> Any:
        raise NotImplementedError

    def update(self, state: Any, prompt_ids: list[int], phases: tuple[str, str]) -> UpdateResult:
        """Verify the held draft against `prompt_ids`, keep what passes, and decode the rest: the new draft.

        Args:
            state (Any): the request's decoding state.
            prompt_ids (list[int]): the prompt as known now, S_i.
            phases (tuple[str, str]): the phases the verify pass and the regeneration are counted under.
        """
        raise NotImplementedError

    def baseline(self, prompt_ids: list[int]) -> UpdateResult:
        """Decode S_n from scratch: an update with no draft and a fresh state.

        Args:
            prompt_ids (list[int]): the complete request's prompt, S_n.
        """
        return self.update(self.new_state(), prompt_ids, ("baseline", "baseline"))

    def stream(self, prompts: list[list[int]]) -> StreamResult:
        """Replay S_1..S_n; updates before the last are drafting, the last is residual.

        Args:
            prompts (list[list[int]]): the prompts S_1..S_n as token ids.
        """
        state = self.new_state()
        steps = []
        for index, prompt_ids in enumerate(prompts):
            final = index == len(prompts) - 1
            phases = ("verify", "regenerate") if final else ("drafting", "drafting")
            steps.append(self.update(state, prompt_ids, phases))
        return StreamResult(steps)

    def _result(self, answer: list[int], draft: list[int], accepted: int, calls_before: int, clock: Stopwatch) -> UpdateResult:
        """The update timed by `clock` (from `stopwatch()`) that began with `calls_before` counted forwards."""
        return UpdateResult(
            answer=answer,
            draft_length=len(draft),
            accepted=accepted,
            forwards=sum(self.forwards.values()) - calls_before,
            seconds=clock.seconds(),
        )
