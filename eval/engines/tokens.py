"""Token-list helpers every engine, the lookup and the typing simulation share
(no model, no engine: the engines, `decode` and `lookup` all import this module)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from headstart.completion import cut_at_stop


class AnswerEnd(frozenset):
    """The ids that end an answer (a set of them: engines ask `token in end`) and, for a model
    prompted in the completion format, the texts that end it (stop strings, as vLLM's `stop`).
    An answer ends at its first end token, or at the token whose decoding completes a stop
    string (kept; the text is cut before the string). The rule reads the answer's tokens only,
    so the baseline, the stream and the counted path end every answer at the same token."""

    stop_strings: tuple[str, ...]
    decode: Callable[[list[int]], str]

    def __new__(cls, token_ids: Iterable[int], stop_strings: Iterable[str] = (),
                decode: Callable[[list[int]], str] | None = None) -> AnswerEnd:
        end = super().__new__(cls, token_ids)
        if stop_strings and decode is None:
            raise ValueError("stop strings need the tokenizer's decode")
        end.stop_strings, end.decode = tuple(stop_strings), decode
        return end

    def __reduce__(self) -> tuple:  # the ids alone cross to other processes (vLLM workers): the cut stays here
        return frozenset, (set(self),)

    def stop_length(self, tokens: list[int]) -> int | None:
        """How many of `tokens` the answer keeps when their text holds a stop string: through the
        token that completes the earliest one; None when it holds none.

        Args:
            tokens (list[int]): the answer's token ids.
        """
        if not self.stop_strings or not any(stop in self.decode(tokens) for stop in self.stop_strings):
            return None
        for length in range(1, len(tokens) + 1):
            text = self.decode(tokens[:length])
            if any(stop in text for stop in self.stop_strings):
                return length
        return None

    def text(self, tokens: list[int]) -> str:
        """The answer's text as a user reads it: decoded, cut before its first stop string.

        Args:
            tokens (list[int]): the answer's token ids.
        """
        return cut_at_stop(self.decode(tokens), self.stop_strings)[0]


def common_prefix_length(a: list, b: list) -> int:
    """Number of leading items two sequences share.

    Args:
        a (list): the first sequence.
        b (list): the second sequence.
    """
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def reused_prefix(cached_ids: list[int], prompt_ids: list[int], draft: list[int]) -> int:
    """Cached tokens a verify pass of `draft` after `prompt_ids` reuses: the common prefix with
    what the cache holds, short of the prompt's last token (its logits judge draft token 0).

    Args:
        cached_ids (list[int]): the tokens the cache holds.
        prompt_ids (list[int]): the prompt of the verify pass.
        draft (list[int]): the draft it verifies.
    """
    return min(common_prefix_length(cached_ids, prompt_ids + draft), len(prompt_ids) - 1)


def through_first_eos(tokens: list[int], eos_token_ids: set[int]) -> list[int]:
    """`tokens` up to and including the first EOS (all of them when there is none); with an
    `AnswerEnd`'s stop strings, up to the first end of either kind (`tokens` read from the answer's start).

    Args:
        tokens (list[int]): the token ids.
        eos_token_ids (set[int]): the ids that end an answer (an `AnswerEnd` for stop strings too).
    """
    for position, token in enumerate(tokens):
        if token in eos_token_ids:
            tokens = tokens[: position + 1]
            break
    stop = eos_token_ids.stop_length(tokens) if isinstance(eos_token_ids, AnswerEnd) else None
    return tokens[:stop] if stop is not None else tokens


def answer_finished(answer: list[int], eos_token_ids: set[int], max_new_tokens: int) -> bool:
    """Decoding stops at the first EOS (kept), at the token budget, or (an `AnswerEnd` with stop
    strings) once the answer's text holds a stop string.

    Args:
        answer (list[int]): the answer's token ids.
        eos_token_ids (set[int]): the ids that end an answer (an `AnswerEnd` for stop strings too).
        max_new_tokens (int): the most tokens an answer may have.
    """
    if not answer:
        return False
    if answer[-1] in eos_token_ids or len(answer) >= max_new_tokens:
        return True
    return isinstance(eos_token_ids, AnswerEnd) and eos_token_ids.stop_length(answer) is not None


def leading_run(passes: list[bool]) -> int:
    """Number of leading True values (the tokens of a draft judged in a row).

    Args:
        passes (list[bool]): whether each draft token passed.
    """
    run = 0
    for passed in passes:
        if not passed:
            break
        run += 1
    return run
