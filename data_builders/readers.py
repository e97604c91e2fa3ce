"""The data builders' input streams: a local file's rows with its SHA-256, or a hub dataset.

Rows come one at a time (`headstart.files.iter_raw_rows`), so a 1M-row file never
sits in memory; lines that are not valid UTF-8 or not a JSON object come back with
their drop reason, so the builder can count them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from headstart.files import RawRow, iter_raw_rows
from headstart.fingerprint import file_sha256


def file_rows(path: Path, fingerprint: dict[str, str]) -> Iterator[RawRow]:
    """Rows of a local file; `fingerprint["sha256"]` is set once the reader is done with it
    (also when it stops early, at max_rows).

    Args:
        path (Path): the local file.
        fingerprint (dict[str, str]): the dict its "sha256" is written into.
    """
    try:
        yield from iter_raw_rows(path)
    finally:
        if path.is_file():
            fingerprint["sha256"] = file_sha256(path)


def iter_hub(hub_id: str, split: str, config_name: str | None) -> Iterator[RawRow]:
    """A hub dataset in streaming mode (needs network, and a token for gated sets).

    Args:
        hub_id (str): the dataset's hub id.
        split (str): the split.
        config_name (str | None): the dataset's configuration, or None.
    """
    from datasets import load_dataset

    dataset = load_dataset(hub_id, config_name, split=split, streaming=True)
    for number, row in enumerate(dataset, 1):
        yield RawRow(number, dict(row))


def file_stamp(path: Path) -> str:
    """A cheap identity of a file (size and mtime) for resume keys.

    Args:
        path (Path): the file.
    """
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
