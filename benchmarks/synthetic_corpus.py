"""Rows in the real schemas of LMSYS-Chat-1M and Evol-CodeAlpaca, made up here.

LMSYS-Chat-1M may not be redistributed and no copy of Evol-CodeAlpaca is at
hand, so tests and the benchmark write their inputs with these functions.
Rows are deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from headstart import files

_CATEGORIES = ["harassment", "hate", "self-harm", "sexual", "violence"]
_TOPICS = ["a binary heap", "the French revolution", "photosynthesis", "a REST client", "compound interest",
           "a sorting network", "the moon landing", "a budget spreadsheet", "sourdough bread", "a chess opening"]
_ASKS = ["Explain {t} to me.", "Write a short essay about {t}.", "Give me three facts about {t}.",
         "Summarise what you know about {t}.", "Write Python code that models {t}."]
_DETAILS = ["Keep it under two hundred words.", "Use simple language.", "Add an example at the end.",
            "Format the answer as a list.", "Mention one common mistake.", "Assume I am a student."]


def moderation(flagged: bool = False) -> dict:
    return {
        "categories": {c: False for c in _CATEGORIES},
        "category_scores": {c: 0.001 for c in _CATEGORIES},
        "flagged": flagged,
    }


def lmsys_row(index: int, request: str, answer: str, **overrides) -> dict:
    """One conversation in the LMSYS-Chat-1M schema; `overrides` replace fields."""
    row = {
        "conversation_id": f"conv-{index:07d}",
        "model": "vicuna-13b",
        "conversation": [{"role": "user", "content": request}, {"role": "assistant", "content": answer}],
        "turn": 1,
        "language": "English",
        "openai_moderation": [moderation(), moderation()],
        "redacted": False,
    }
    row.update(overrides)
    return row


def lmsys_rows(count: int, seed: int = 0) -> Iterator[dict]:
    """Plausible conversations: mostly valid, some non-English, redacted, flagged or one-sentence."""
    rng = random.Random(seed)
    for index in range(count):
        topic = rng.choice(_TOPICS)
        sentences = [rng.choice(_ASKS).format(t=topic)] + rng.sample(_DETAILS, rng.randint(0, 3))
        request = " ".join(sentences) + f" (request {index})"
        answer = f"Here is an answer about {topic}. " * rng.randint(2, 30)
        roll = rng.random()
        overrides = {}
        if roll < 0.1:
            overrides["language"] = rng.choice(["Portuguese", "Chinese", "Russian"])
        elif roll < 0.13:
            overrides["redacted"] = True
        elif roll < 0.15:
            overrides["openai_moderation"] = [moderation(True), moderation()]
        yield lmsys_row(index, request, answer, **overrides)


def evol_codealpaca_rows(count: int, seed: int = 0) -> Iterator[dict]:
    """Instruction/output pairs in the Evol-CodeAlpaca schema."""
    rng = random.Random(seed)
    names = ["merge_intervals", "parse_duration", "top_k_words", "matrix_trace", "dedupe_emails", "balance_brackets"]
    for index in range(count):
        name = names[index % len(names)]
        instruction = (
            f"Write a Python function `{name}_{index}` for a data pipeline. "
            f"It must handle empty input gracefully. Add a docstring and type hints.\n"
            f"```python\ndef {name}_{index}(items):\n    pass\n```\n"
            f"Explain the time complexity in one sentence."
        )
        output = (f"```python\ndef {name}_{index}(items: list) -> list:\n"
                  "    \"\"\"Process items.\"\"\"\n    return list(items)\n```\n")
        if rng.random() < 0.5:
            output += "This runs in linear time."
        yield {"instruction": instruction, "output": output}


def write_jsonl(path: Path, rows) -> Path:
    """headstart.files.write_jsonl, into a new folder if need be; returns the path for the caller's command."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_jsonl(path, rows, ensure_ascii=False)
    return path
