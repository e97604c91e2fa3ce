"""Read a benchmark's rows from a local file (tests, CI, offline) or its hub id."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable


def read_rows(path: str | Path | None, hub_id: str, split: str, hub_config: str | None = None) -> list[dict[str, Any]]:
    """Rows of `path` (.jsonl, .jsonl.gz, .json array, .parquet), else of the hub dataset."""
    if path is None:
        return _hub_rows(hub_id, split, hub_config)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark data file not found: {path}")
    name = path.name
    if name.endswith(".parquet"):
        import datasets

        return list(datasets.load_dataset("parquet", data_files=str(path), split="train"))
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        text = handle.read()
    if name.endswith((".json", ".json.gz")) and text.lstrip().startswith("["):
        return json.loads(text)
    return [_parse_line(line, path, number) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def require_fields(rows: Iterable[dict[str, Any]], fields: tuple[str, ...], source: str) -> None:
    """Fail with the missing field's name rather than a KeyError deep inside a loader."""
    for index, row in enumerate(rows):
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{source}: row {index} lacks field(s) {', '.join(missing)}; it has {', '.join(sorted(row))}")


def _parse_line(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error


def _hub_rows(hub_id: str, split: str, hub_config: str | None) -> list[dict[str, Any]]:
    import datasets

    if hub_id.startswith(("http://", "https://")):
        return list(datasets.load_dataset("json", data_files=hub_id, split="train"))
    return list(datasets.load_dataset(hub_id, hub_config, split=split))
