"""Benchmarks by name."""

from __future__ import annotations

from eval.benchmarks.base import Benchmark, Request, Score
from eval.benchmarks.humaneval import HumanEval

BENCHMARKS: dict[str, type] = {"humaneval": HumanEval}


def get_benchmark(name: str, path: str | None = None) -> Benchmark:
    """Instantiate a benchmark by name; `path` reads a local copy instead of the default source."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    return BENCHMARKS[name](path=path)


__all__ = ["BENCHMARKS", "Benchmark", "Request", "Score", "get_benchmark"]
