"""Benchmarks by name."""

from __future__ import annotations

import inspect
from dataclasses import replace

from eval.benchmarks.base import Benchmark, Request, Score
from eval.benchmarks.canitedit import CanItEdit
from eval.benchmarks.chat import Chat
from eval.benchmarks.coedit import CoEdIT
from eval.benchmarks.ds1000 import DS1000
from eval.benchmarks.humaneval import HumanEval
from eval.benchmarks.mbpp import MBPP

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


__all__ = ["BENCHMARKS", "QUALITY_METRIC", "Benchmark", "Request", "Score", "get_benchmark"]
