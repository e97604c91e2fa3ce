"""Stream rows out of json, jsonl, jsonl.gz, parquet files or a hub dataset.

Rows come one at a time, so a 1M-row file never sits in memory. Lines that are
not valid UTF-8 or not a JSON object are reported, not raised, so the builder
can count them; the file's SHA-256 is computed on the way through.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator


@dataclass
class RawRow:
    """One input row, or why it could not be read (`error` is a drop reason)."""

    number: int
    data: dict[str, Any] | None
    error: str | None = None


class HashingReader:
    """A binary file wrapper that hashes every byte read through it."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.handle.close()

    def finish(self) -> str:
        """Hash the unread rest (a reader may stop early) and return the hex digest."""
        while chunk := self.handle.read(1 << 20):
            self.digest.update(chunk)
        return self.digest.hexdigest()


SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")


def file_format(path: Path) -> str:
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix.lstrip(".")
    raise ValueError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")


def iter_file(path: Path, fingerprint: dict[str, str]) -> Iterator[RawRow]:
    """Rows of a local file; `fingerprint["sha256"]` is set once the file is consumed."""
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    kind = file_format(path)
    if kind == "parquet":
        try:
            yield from _iter_parquet(path)
        finally:  # also when the reader stops early (max_rows)
            fingerprint["sha256"] = sha256_file(path)
        return
    with path.open("rb") as raw:
        reader = HashingReader(raw)
        stream = gzip.GzipFile(fileobj=reader) if kind.endswith(".gz") else reader
        try:
            if kind.startswith("jsonl"):
                yield from _iter_jsonl(stream)
            else:
                yield from _iter_json_array(stream.read())
        finally:
            fingerprint["sha256"] = reader.finish()


def _iter_jsonl(stream) -> Iterator[RawRow]:
    buffered = _lines(stream)
    for number, line in enumerate(buffered, 1):
        if not line.strip():
            continue
        yield _parse(number, line)


def _lines(stream, chunk_size: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a binary stream, read in 1 MiB chunks (bounded memory for any file size)."""
    rest = b""
    while chunk := stream.read(chunk_size):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def _parse(number: int, line: bytes) -> RawRow:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return RawRow(number, None, "invalid_utf8")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return RawRow(number, None, "malformed_json")
    if not isinstance(data, dict):
        return RawRow(number, None, "malformed_json")
    return RawRow(number, data)


def _iter_json_array(blob: bytes) -> Iterator[RawRow]:
    """A whole-file JSON array (small benchmark files such as sanitized MBPP)."""
    try:
        rows = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"JSON file is neither valid UTF-8 JSON nor an array: {error}") from error
    if not isinstance(rows, list):
        raise ValueError("a .json input must hold an array of objects (use .jsonl for one object per line)")
    for number, row in enumerate(rows, 1):
        yield RawRow(number, row) if isinstance(row, dict) else RawRow(number, None, "malformed_json")


def _iter_parquet(path: Path, batch_size: int = 4096) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
        for row in batch.to_pylist():
            number += 1
            yield RawRow(number, row)


def iter_hub(hub_id: str, split: str, config_name: str | None) -> Iterator[RawRow]:
    """A hub dataset in streaming mode (needs network, and a token for gated sets)."""
    from datasets import load_dataset

    dataset = load_dataset(hub_id, config_name, split=split, streaming=True)
    for number, row in enumerate(dataset, 1):
        yield RawRow(number, dict(row))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_stamp(path: Path) -> str:
    """A cheap identity of a file (size and mtime) for resume keys."""
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
