"""An append-only JSONL cache of generated answers, so a crash loses nothing.

Each finished batch is appended and fsynced before the next one starts
(`headstart.files.append_jsonl`); a line cut short by a kill is dropped. Read-only
caches (e.g. the answers shipped with the embedded recipe) are consulted before generating.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from headstart.files import append_jsonl, read_jsonl


def answer_key(model: str, prompt: str, max_new_tokens: int, stop: tuple[str, ...] = ()) -> str:
    """What identifies a greedy answer: the model (`model_identity`), the exact prompt text,
    the length budget, and the stop strings it was cut at (two completion frames may frame a
    request alike and end its answer differently).

    Args:
        model (str): the model source that answers.
        prompt (str): the exact prompt text.
        max_new_tokens (int): the answer's length budget in tokens.
        stop (tuple[str, ...]): the stop strings (none: a chat model's answer, keyed as before they existed).
    """
    payload = json.dumps([model, prompt, max_new_tokens, "greedy", *([list(stop)] if stop else [])], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def model_identity(model: str) -> str:
    """The model part of an answer's key: a local directory or file with the content hash of what
    loads from it, since iterated self-distillation answers with an adapter that is retrained at
    the same path, and its second round must not reuse the first round's answers. An embedded
    name (its weights are a pinned package) or a hub id stays as given: the shipped caches are
    keyed by the name, and a hub repository updated in place is not noticed (pin a revision by
    downloading it to a directory).

    Args:
        model (str): the model source that answers.
    """
    from headstart.models import EMBEDDED_MODELS, is_hub_id, weights_fingerprint

    if model.lower() in EMBEDDED_MODELS or is_hub_id(model):
        return model
    return f"{model}@{weights_fingerprint(model)}"


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
        for entry in read_jsonl(path):  # a killed run's cut last line is dropped
            self._remember(entry)

    def _remember(self, entry: dict) -> None:
        self.answers[entry["key"]] = entry["answer"]
        if "finished" in entry:
            self.ended[entry["key"]] = bool(entry["finished"])

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> str:
        """The cached answer of `key`.

        Args:
            key (str): the answer's key (`answer_key`).
        """
        return self.answers[key]

    def finished(self, key: str) -> bool | None:
        """Whether the answer ended before the token cap; None for an entry written before the flag.

        Args:
            key (str): the answer's key (`answer_key`).
        """
        return self.ended.get(key)

    def add(self, entries: list[dict]) -> None:
        """Append entries ({key, answer, ...}) durably.

        Args:
            entries (list[dict]): the entries to add, each with its key and answer.
        """
        append_jsonl(self.path, entries, ensure_ascii=False, sort_keys=True)
        for entry in entries:
            self._remember(entry)
