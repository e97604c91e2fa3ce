"""Read a benchmark's rows from a local file (tests, CI, offline) or its hub id.

Where each benchmark lives (hub id, config, split, the vendored copy, its ids)
is written once, in `headstart.benchmark_registry`, which the decontamination
filter of the data builders reads too. A loader given a local file reads only
that file: no hub lookup, so an offline machine never waits on retries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from headstart.benchmark_registry import DATA, DataSource
from headstart.benchmark_registry import read_rows as _read_rows


def read_rows(path: str | Path | None, source: DataSource) -> list[dict[str, Any]]:
    """Rows of `path` (.jsonl, .jsonl.gz, .json array, .parquet), else of `source`'s hub split.
    A relative `path` is tried from the working directory, then from the project root."""
    return _read_rows(source, path)


def require_fields(rows: Iterable[dict[str, Any]], fields: tuple[str, ...], source: str) -> None:
    """Fail with the missing field's name rather than a KeyError deep inside a loader."""
    for index, row in enumerate(rows, 1):
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{source}: row {index} (counting from 1) lacks field(s) {', '.join(missing)}; "
                             f"it has {', '.join(sorted(row))}")


__all__ = ["DATA", "DataSource", "read_rows", "require_fields"]
