"""Answers that are not answers: a token or a line repeated up to the length cap, a special token
inside the answer, or a chat format's markers written out as text. Each record names what its
answers show; the report counts them, so a speedup over degenerate output is never read as a
speedup alone (a repeated token is the cheapest answer there is to draft and to verify).

The rules are exact and narrow, so that ordinary answers are never flagged:
* `repeat_token`: the answer hit the length cap, and its last REPEATED_TOKENS tokens are one token
  (a quarter of the cap when that is fewer, but never fewer than MIN_REPEATED_TOKENS).
* `repeat_line`: the answer hit the length cap, and the REPEATED_LINES lines before the cut last one
  are one non-blank line, indentation included, which the cut line begins.
* `special_token`: a special token of the tokenizer stands anywhere but as the final end token.
* `special_text`: the decoded answer contains a chat marker's text (`<|im_start|>` spelled out in
  ordinary pieces): of a chat format headstart renders (CHAT_MARKERS), or a special token of the
  tokenizer written `<|...|>`. Names such as `<unk>`, `<pad>` or `<mask>` are not markers: code
  writes them as strings.
"""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase

from headstart.prompts import CHAT_MARKERS

REPEATED_TOKENS = 16
MIN_REPEATED_TOKENS = 8  # fewer equal tokens at the end ("))", blank lines) are ordinary text
REPEATED_LINES = 4


class DegenerateCheck:
    """What a tokenizer, an end-token set and a length cap say of answers: `reasons(ids)`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Iterable[int], max_new_tokens: int) -> None:
        """
        Args:
            tokenizer (PreTrainedTokenizerBase): the model's tokenizer.
            eos_token_ids (Iterable[int]): the ids that end an answer.
            max_new_tokens (int): the length cap of an answer, in tokens.
        """
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.special_ids = set(tokenizer.all_special_ids) | {
            token_id for token_id, token in tokenizer.added_tokens_decoder.items() if token.special}
        written_markers = (t for t in tokenizer.all_special_tokens if t.startswith("<|") and t.endswith("|>"))
        self.markers = sorted({*CHAT_MARKERS, *written_markers})

    def reasons(self, ids: list[int]) -> list[str]:
        """The rules (module docstring) an answer breaks, in their order there; [] for none.

        Args:
            ids (list[int]): the answer's token ids, its final end token included when it has one.
        """
        body = ids[:-1] if ids and ids[-1] in self.eos_token_ids else ids
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        capped = len(ids) >= self.max_new_tokens and body == ids
        found = []
        run = min(REPEATED_TOKENS, max(MIN_REPEATED_TOKENS, self.max_new_tokens // 4))
        if capped and repeats_one_token(ids, run):
            found.append("repeat_token")
        if capped and repeats_one_line(text, REPEATED_LINES):
            found.append("repeat_line")
        if any(token in self.special_ids for token in body):
            found.append("special_token")
        if any(marker in text for marker in self.markers):
            found.append("special_text")
        return found


def repeats_one_token(ids: list[int], run: int) -> bool:
    """Whether the last `run` ids are one id.

    Args:
        ids (list[int]): the token ids.
        run (int): how many final ids must be equal.
    """
    return len(ids) >= run and len(set(ids[-run:])) == 1


def repeats_one_line(text: str, run: int) -> bool:
    """Whether `text`, cut off mid-line, ends in `run` equal non-blank lines and then a beginning of that line.

    Args:
        text (str): the decoded answer, cut at the length cap.
        run (int): how many equal whole lines must precede the cut one.
    """
    *whole, cut = text.split("\n")
    last = whole[-run:]
    return len(last) == run and bool(last[0].strip()) and len(set(last)) == 1 and last[0].startswith(cut)
