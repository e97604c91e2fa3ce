"""An append-only JSONL cache of generated answers, so a crash loses nothing.

Each finished batch is appended and fsynced before the next one starts; a line
cut short by a kill is ignored on reading. Read-only caches (e.g. the answers
shipped with the embedded recipe) are consulted before generating.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def answer_key(model: str, prompt: str, max_new_tokens: int) -> str:
    """What identifies a greedy answer: the model, the exact prompt text, the length budget."""
    payload = json.dumps([model, prompt, max_new_tokens, "greedy"], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class AnswerCache:
    """Answers by key, loaded from `path` (writable) and any read-only files."""

    def __init__(self, path: Path, read_only: list[Path] | None = None) -> None:
        self.path = Path(path)
        self.answers: dict[str, str] = {}
        self.ended: dict[str, bool] = {}  # `finished` of the entries that record it
        for extra in read_only or []:
            if not Path(extra).is_file():
                raise FileNotFoundError(f"generation.cache_files: answer cache not found: {extra}")
            self._load(Path(extra))
        if self.path.is_file():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        with path.open("rb") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue  # the partial last line of a killed run
                self.answers[entry["key"]] = entry["answer"]
                if "finished" in entry:
                    self.ended[entry["key"]] = bool(entry["finished"])

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> str:
        return self.answers[key]

    def finished(self, key: str) -> bool | None:
        """Whether the answer ended before the token cap; None for an entry written before the flag."""
        return self.ended.get(key)

    def add(self, entries: list[dict]) -> None:
        """Append entries ({key, answer, ...}) durably."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n" for e in entries)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        for entry in entries:
            self.answers[entry["key"]] = entry["answer"]
            if "finished" in entry:
                self.ended[entry["key"]] = bool(entry["finished"])
