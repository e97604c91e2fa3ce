"""What a build saw: inputs, counts at every filter, drops by reason. Feeds the card."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Why each drop reason exists, for the card.
REASONS = {
    "invalid_utf8": "the line is not valid UTF-8",
    "malformed_json": "the line is not a JSON object",
    "missing_field": "a required field is absent or null",
    "non_string_field": "a required text field is not a string",
    "non_int_field": "an id field is not an integer",
    "non_bool_field": "a flag field is not a boolean",
    "empty_field": "a required text field is empty",
    "empty_turn": "a conversation turn is empty",
    "bad_conversation": "the conversation is not a user turn followed by an assistant turn",
    "absurd_length": "request or answer longer than filters.max_request_chars / max_answer_chars",
    "invalid_text": "the text holds NUL characters",
    "language": "LMSYS language not in filters.languages",
    "redacted": "LMSYS conversation redacted",
    "flagged": "a message was flagged by OpenAI moderation",
    "mbpp_split_not_read": "MBPP task id outside the splits read (filters.mbpp_splits; test 11-510 never)",
    "single_segment": "fewer than filters.min_segments segments (nothing to stream)",
    "duplicate": "same normalised request text as an earlier request",
    "contaminated_exact": "request equals a benchmark text (normalised)",
    "contaminated_ngram": "request or answer shares a word n-gram with a benchmark text",
    "too_many_tokens": "prompt + draft + answer would exceed caps.max_tokens",
    "over_pair_cap": "not needed to reach caps.max_pairs",
    "empty_answer": "the answer is empty (excluded, as in the protocol)",
    "answer_hit_token_cap": "the self-distilled answer reached generation.max_new_tokens without ending: cut, it would "
                            "teach the model to stop early",
}

# What an interrupted build says when it left nothing (a Ctrl-C before anything was worth keeping).
NOTHING_KEPT = "nothing of this build was kept; rerun to build again"


def explain(reason: str) -> str:
    """What a drop reason means, in words ("" for an unknown one).

    Args:
        reason (str): the reason, with or without its ":detail".
    """
    return REASONS.get(reason.split(":", 1)[0], "")


@dataclass
class Report:
    inputs: list[dict] = field(default_factory=list)
    rows_read: dict[str, int] = field(default_factory=dict)
    read_drops: dict[str, dict[str, int]] = field(default_factory=dict)
    read_drop_rows: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # first rows per reason
    funnel: list[tuple[str, int]] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)
    decontamination: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall clock per pass, summed over the runs of one build

    def drop(self, reason: str, count: int) -> None:
        """Count `count` rows dropped for `reason` (none: nothing recorded).

        Args:
            reason (str): why they were dropped.
            count (int): how many.
        """
        if count:
            self.drops[reason] = self.drops.get(reason, 0) + int(count)

    def step(self, label: str, remaining: int) -> None:
        """Record a step of the funnel: how many rows remain after it.

        Args:
            label (str): the step's name.
            remaining (int): rows remaining.
        """
        self.funnel.append((label, int(remaining)))

    def all_drops(self) -> Counter:
        total: Counter = Counter(self.drops)
        for per_source in self.read_drops.values():
            total.update(per_source)
        return total

    @contextmanager
    def timed(self, work: Path, name: str) -> Iterator[None]:
        """Add the wall-clock seconds of the block to pass `name`, kept in the work directory until
        the build finishes, so that a killed and resumed build reports the time of all its runs
        (a kill Python cannot see, SIGKILL, loses the time of the run it ends).

        Args:
            work (Path): the build's work directory.
            name (str): the pass's name.
        """
        start = time.perf_counter()
        try:
            yield
        finally:
            if work.is_dir():  # a build refused on reading removes its fresh work directory
                self._add_seconds(work / "seconds.json", name, time.perf_counter() - start)

    def _add_seconds(self, path: Path, name: str, elapsed: float) -> None:
        seconds = json.loads(path.read_text()) if path.is_file() else {}
        seconds[name] = seconds.get(name, 0.0) + elapsed
        path.write_text(json.dumps(seconds, indent=1) + "\n")
        self.seconds[name] = seconds[name]

    @staticmethod
    def forget_seconds(work: Path) -> None:
        """Drop the seconds kept in the work directory (the build finished).

        Args:
            work (Path): the build's work directory.
        """
        (work / "seconds.json").unlink(missing_ok=True)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def load(cls, path: Path) -> Report:
        """A report read back from its JSON file.

        Args:
            path (Path): the report's JSON file.
        """
        data = json.loads(path.read_text())
        data["funnel"] = [tuple(x) for x in data["funnel"]]
        return cls(**data)
