"""Reading rows out of data files, and JSON-lines logs that survive a crash: one home.

Row files (.jsonl, .jsonl.gz, .json, .json.gz, .parquet) are read one row at a
time in bounded memory, two ways over the same parser:
- `iter_rows`: strict, for benchmark and decontamination files; the first bad
  row is an error naming the file and line.
- `iter_raw_rows`: tolerant, for the data builders' sources; a bad line comes
  back as a `RawRow` with its drop reason, so a build can count and report it.

A JSON-lines log (`append_jsonl`, `read_jsonl`) is appended one fsynced batch at
a time; a last line cut short by a kill is dropped on reading and cut away
before the next append, so it never merges with the next record.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet")
CHUNK = 1 << 20  # the read size: bounded memory for any file size


@dataclass
class RawRow:
    """One input row, or why it could not be read (`error`: a drop reason)."""

    number: int  # the line of a JSON-lines file, else the row, counting from 1
    data: dict[str, Any] | None
    error: str | None = None  # "invalid_utf8" or "malformed_json" (not JSON, or not an object)
    detail: str = ""  # what is wrong, in words: "not a JSON line (...)", "not a JSON object: ..."


def file_format(path: Path) -> str:
    """"jsonl", "jsonl.gz", "json", "json.gz" or "parquet", from the file's name.

    Args:
        path (Path): the data file.
    """
    name = path.name.lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix.lstrip(".")
    raise ValueError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")


def iter_raw_rows(path: str | Path) -> Iterator[RawRow]:
    """Every row of a local file; a line that is not UTF-8 or not a JSON object is a RawRow
    with its drop reason. A file that cannot be read at all (gzip, parquet, a .json that is
    not an array) is a ValueError naming it.

    Args:
        path (str | Path): the data file (JSON lines, JSON or parquet, gzipped or not).
    """
    yield from _read(Path(path), strict_utf8=False)


def iter_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every row of a local file as a dict; the first bad row is a ValueError naming the file and line.

    Args:
        path (str | Path): the data file (JSON lines, JSON or parquet, gzipped or not).
    """
    path = Path(path)
    for row in _read(path, strict_utf8=True):
        if row.error is not None:
            raise ValueError(f"{path}:{row.number}: {row.detail}")
        yield row.data


def require_file(path: str | Path, what: str = "data file") -> None:
    """Refuse a path that is not a file, saying which way: absent, or a directory.

    Args:
        what (str): what the file is, for the error ("data file").
    """
    if Path(path).is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory; give a file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} not found: {path}")


def _read(path: Path, strict_utf8: bool) -> Iterator[RawRow]:
    require_file(path)
    kind = file_format(path)
    if kind == "parquet":
        yield from _parquet_rows(path)
        return
    try:
        with path.open("rb") as raw:
            stream = gzip.GzipFile(fileobj=raw) if kind.endswith(".gz") else raw
            chunks = _utf8_checked(stream, path) if strict_utf8 else _chunks(stream)
            yield from _json_rows(chunks, array_allowed=kind.startswith("json") and not kind.startswith("jsonl"),
                                  path=path)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise ValueError(f"{path}: not a readable gzip file ({error})") from error


def _chunks(stream: BinaryIO) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


def _utf8_checked(stream: BinaryIO, path: Path) -> Iterator[bytes]:
    """The stream's chunks, failing at the first byte that is not UTF-8 (wherever the lines break)."""
    decoder, offset, lines = codecs.getincrementaldecoder("utf-8")(), 0, 0
    for chunk in _chunks(stream):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as error:
            line = lines + chunk.count(b"\n", 0, error.start) + 1
            raise ValueError(f"{path}: not UTF-8 text (line {line}, byte {offset + error.start}): a binary file?") from error
        offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
        yield chunk
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (the last bytes, line {lines + 1}): a binary file?") from error


def _json_rows(chunks: Iterator[bytes], array_allowed: bool, path: Path) -> Iterator[RawRow]:
    """A JSON-lines stream; a .json file whose text starts with `[` is one array, read whole."""
    first = next(chunks, b"")
    if array_allowed and first.lstrip().startswith(b"["):
        yield from _array_rows(first + b"".join(chunks), path)
        return
    for number, line in enumerate(_lines(first, chunks), 1):
        if line.strip():
            yield _parse(number, line)


def _lines(first: bytes, chunks: Iterator[bytes]) -> Iterator[bytes]:
    rest = first
    for chunk in chunks:
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        yield from lines
    yield from rest.split(b"\n")


def _parse(number: int, line: bytes) -> RawRow:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        return RawRow(number, None, "invalid_utf8", f"not UTF-8 text ({error})")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        return RawRow(number, None, "malformed_json", f"not a JSON line ({error or type(error).__name__})")
    if not isinstance(data, dict):
        return RawRow(number, None, "malformed_json", f"not a JSON object: {text[:80]}")
    return RawRow(number, data)


def _array_rows(blob: bytes, path: Path) -> Iterator[RawRow]:
    """A whole-file JSON array (small benchmark files such as sanitized MBPP)."""
    try:
        rows = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON array ({error})") from error
    if not isinstance(rows, list):
        raise ValueError(f"{path}: a .json file must hold an array of objects (use .jsonl for one object per line)")
    for number, row in enumerate(rows, 1):
        if isinstance(row, dict):
            yield RawRow(number, row)
        else:
            yield RawRow(number, None, "malformed_json", f"not a JSON object: {json.dumps(row)[:80]}")


def _parquet_rows(path: Path, batch_size: int = 4096) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_size)
    except Exception as error:  # pyarrow's errors name no file
        raise ValueError(f"{path}: not a readable parquet file ({type(error).__name__}: {error})") from error
    number = 0
    for batch in batches:
        for row in batch.to_pylist():
            number += 1
            yield RawRow(number, row)


def read_text(path: str | Path) -> str:
    """A whole UTF-8 text file; one that is not UTF-8 is a ValueError naming the file, the line
    and the byte (a bare UnicodeDecodeError names none of them, and is a ValueError too: an
    entry point would print it as its one error line).

    Args:
        path (str | Path): the text file.
    """
    path = Path(path)
    blob = path.read_bytes()
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as error:
        line = blob.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}: not UTF-8 text (line {line}, byte {error.start})") from error


def read_json_file(path: str | Path) -> Any:
    """A whole JSON file (a dataset's dataset_dict.json or state.json, a DeepSpeed config); one
    that is not UTF-8 or not JSON is a ValueError naming the file and the line.

    Args:
        path (str | Path): the JSON file.
    """
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON (line {error.lineno}, column {error.colno}: {error.msg})") from error


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines log ([] when absent). The last line, cut short by a crash
    mid-write, is dropped; a bad line anywhere else is damage: a ValueError naming it.

    Args:
        path (str | Path): the JSON-lines log.
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a JSON record ({error}); the file is damaged") from error
    return records


def append_jsonl(path: str | Path, records: Iterable[dict[str, Any]], **dumps: Any) -> None:
    """Append records (`json.dumps(record, **dumps)` each), on disk before this returns. A last
    line an earlier crash cut short is cut away first: it would otherwise swallow the next record.

    Args:
        path (str | Path): the JSON-lines file, created if absent.
        records (Iterable[dict[str, Any]]): the records to append.
        dumps (Any): keyword arguments of `json.dumps` for each record.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(record, **dumps) + "\n" for record in records)
    _drop_cut_line(path)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _drop_cut_line(path: Path) -> None:
    """Truncate a file that does not end with a newline back to its last whole line."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("r+b") as handle:
        end = handle.seek(0, os.SEEK_END)
        handle.seek(end - 1)
        if handle.read(1) == b"\n":
            return
        position = end
        while position > 0:
            start = max(0, position - CHUNK)
            handle.seek(start)
            newline = handle.read(position - start).rfind(b"\n")
            if newline >= 0:
                handle.truncate(start + newline + 1)
                return
            position = start
        handle.truncate(0)


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]], **dumps: Any) -> None:
    """Replace a JSON-lines file whole: written beside it, then renamed over it, so that a
    crash leaves the old file or the new one, never half of one.

    Args:
        path (str | Path): the JSON-lines file.
        records (Iterable[dict[str, Any]]): the records it holds afterwards.
        dumps (Any): keyword arguments of `json.dumps` for each record.
    """
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(record, **dumps) + "\n" for record in records))
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)
