"""Token-list helpers every engine, the lookup and the typing simulation share
(no model, no engine: the engines, `decode` and `lookup` all import this module)."""

from __future__ import annotations


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
    """`tokens` up to and including the first EOS (all of them when there is none).

    Args:
        tokens (list[int]): the token ids.
        eos_token_ids (set[int]): the ids that end an answer.
    """
    for position, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: position + 1]
    return tokens


def answer_finished(answer: list[int], eos_token_ids: set[int], max_new_tokens: int) -> bool:
    """Decoding stops at the first EOS (kept) or at the token budget.

    Args:
        answer (list[int]): the answer's token ids.
        eos_token_ids (set[int]): the ids that end an answer.
        max_new_tokens (int): the most tokens an answer may have.
    """
    return bool(answer) and (answer[-1] in eos_token_ids or len(answer) >= max_new_tokens)


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
