"""A results file (results.jsonl): one JSON record per finished request, appended as
each finishes, so that a crash loses at most the line being written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def load_records(path: Path) -> list[dict[str, Any]]:
    """Finished records. The last line, cut short by a crash mid-write, is dropped and
    rewritten away; a bad line anywhere else is damage, an error naming it."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a JSON record ({error}); the results file is damaged") from error
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Add one finished record, on disk before the next request starts."""
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace a results file whole: written beside it, then renamed over it, so that a
    crash leaves the old file or the new one, never half of one."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)
