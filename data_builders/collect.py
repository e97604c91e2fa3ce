"""Pass 1: stream every source, validate rows, keep eligible requests in an Arrow file.

The output is written batch by batch (bounded memory for 1M rows), atomically,
under a key of the inputs and the filters, so a resumed build skips this pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from datasets import Dataset
from tqdm import tqdm

from data_builders.config import BuildConfig, SourceSpec
from data_builders.readers import file_rows, file_stamp, iter_hub
from data_builders.report import Report
from data_builders.sources import SOURCES, Limits, Request
from headstart.benchmark_registry import MBPP_SPLIT_IDS
from headstart.files import RawRow
from headstart.paths import resolve_path

SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("source_id", pa.string()),
        ("request", pa.string()),
        ("reference", pa.string()),
        ("segments", pa.list_(pa.string())),  # null: segment_request decides
    ]
)
BATCH_ROWS = 4096
DROP_ROWS_SHOWN = 5
# Bump when an adapter's output changes: part of the resume key of pass 1, which
# stores rendered requests (MBPP's text and segments come from headstart.segment).
# 2: MBPP asserts bare, no fence.
VERSION = 2


def source_spec(config: BuildConfig, name: str) -> SourceSpec:
    """The configured source `name`, refused when no such source exists.

    Args:
        config (BuildConfig): the build's settings.
        name (str): the source's name.
    """
    if name not in SOURCES:
        raise ValueError(f"sources: unknown source {name!r}; known: {', '.join(SOURCES)}")
    return getattr(config, name)


def collect_key(config: BuildConfig) -> str:
    """Identity of pass 1: source locations (with file size and mtime) and the row filters.

    Args:
        config (BuildConfig): the build's settings.
    """
    parts: list = [VERSION]
    for name in config.sources:
        spec = source_spec(config, name)
        where = file_stamp(resolve_path(spec.path)) if spec.path and resolve_path(spec.path).is_file() else str(spec)
        parts.append([name, where, spec.max_rows])
    parts.append([config.filters.languages, config.filters.max_request_chars, config.filters.max_answer_chars])
    parts.append(sorted(config.filters.mbpp_splits))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def collect(config: BuildConfig, work_dir: Path, report: Report) -> Dataset:
    """The eligible requests of all sources, memory-mapped from `work_dir`.

    Args:
        config (BuildConfig): the build's settings.
        work_dir (Path): the build's work directory.
        report (Report): the build's report, which counts drops.
    """
    key = collect_key(config)
    arrow, stats = work_dir / f"requests-{key}.arrow", work_dir / f"requests-{key}.json"
    if arrow.is_file() and stats.is_file():
        saved = json.loads(stats.read_text())
        report.inputs, report.rows_read, report.read_drops = saved["inputs"], saved["rows_read"], saved["read_drops"]
        report.read_drop_rows = saved.get("read_drop_rows", {})
        return Dataset.from_file(str(arrow))
    check_locations(config)
    work_dir.mkdir(parents=True, exist_ok=True)
    partial = arrow.with_name(arrow.name + ".partial")
    try:
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
            for name in config.sources:
                _collect_source(config, name, writer, report)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, arrow)
    saved = {"inputs": report.inputs, "rows_read": report.rows_read, "read_drops": report.read_drops,
             "read_drop_rows": report.read_drop_rows}
    stats.write_text(json.dumps(saved, indent=1, sort_keys=True))
    return collect(config, work_dir, report)  # read back: a resumed build then reports identically


def check_locations(config: BuildConfig) -> None:
    """Fail before any work when a configured file is missing or empty, naming the key.

    Args:
        config (BuildConfig): the build's settings.
    """
    for name in config.sources:
        spec = source_spec(config, name)
        if spec.path and not resolve_path(spec.path).is_file():
            raise FileNotFoundError(f"{name}.path: input file not found: {spec.path}")
        if spec.path and resolve_path(spec.path).stat().st_size == 0:
            raise ValueError(f"{name}.path: input file is empty: {spec.path}")
        if not spec.path and not (spec.hub_id or SOURCES[name].hub_id):
            raise ValueError(f"{name}: no {name}.path given and the source has no hub id")


def _collect_source(config: BuildConfig, name: str, writer: pa.ipc.RecordBatchStreamWriter, report: Report) -> None:
    spec, info = source_spec(config, name), SOURCES[name]
    limits = Limits(config.filters.max_request_chars, config.filters.max_answer_chars, tuple(config.filters.languages),
                    tuple(MBPP_SPLIT_IDS[split] for split in config.filters.mbpp_splits))
    fingerprint: dict[str, str] = {}
    rows, location = _rows(spec, info, fingerprint)
    drops: Counter = Counter()
    where: dict[str, list[int]] = {}  # the first rows (line numbers in a .jsonl) of each drop reason
    batch: list[Request] = []
    read = kept = 0
    for raw in tqdm(rows, desc=f"read {name}", unit="row", mininterval=1.0):
        read += 1
        result = info.adapter(raw.data, raw.number, limits) if raw.error is None else raw.error
        if isinstance(result, Request):
            batch.append(result)
            kept += 1
        else:
            drops[result] += 1
            if len(where.setdefault(result, [])) < DROP_ROWS_SHOWN:
                where[result].append(raw.number)
        if len(batch) >= BATCH_ROWS:
            _write(writer, batch)
        if spec.max_rows and read >= spec.max_rows:
            break
    if hasattr(rows, "close"):
        rows.close()  # lets the reader finish the file hash
    _write(writer, batch)
    label = f"{name}.path {location}" if spec.path else f"{name} ({location})"
    dropped = ", ".join(f"{reason} x{count} ({_rows_named(where[reason], spec.path)})"
                        for reason, count in sorted(drops.items(), key=lambda item: (-item[1], item[0])))
    if not read:
        raise ValueError(f"{label}: no rows (an empty input)")
    if not kept:
        raise ValueError(f"{label}: none of its {read} rows is a usable request: {dropped}")
    if drops:
        print(f"note: {label}: {read - kept} of {read} rows dropped: {dropped}", file=sys.stderr)
    report.rows_read[name] = read
    report.read_drops[name] = dict(sorted(drops.items()))
    report.read_drop_rows[name] = dict(sorted(where.items()))
    report.inputs.append({"source": name, "location": location, **fingerprint})


def _rows_named(numbers: list[int], path: str | None) -> str:
    """'line 7, 9' for a .jsonl file (its line numbers), else 'row 7, 9'."""
    unit = "line" if path and ".jsonl" in Path(path).name.lower() else "row"
    return f"{unit}{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def _rows(spec: SourceSpec, info, fingerprint: dict[str, str]) -> tuple[Iterator[RawRow], str]:
    if spec.path:
        return file_rows(resolve_path(spec.path), fingerprint), spec.path
    hub_id, split = spec.hub_id or info.hub_id, spec.split or info.split
    fingerprint["hub"] = f"{hub_id} config={info.hub_config} split={split}"
    return iter_hub(hub_id, split, info.hub_config), f"hub:{hub_id}"


def _write(writer: pa.ipc.RecordBatchStreamWriter, batch: list[Request]) -> None:
    if not batch:
        return
    columns = {f: [getattr(r, f) for r in batch] for f in SCHEMA.names}
    writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=SCHEMA))
    batch.clear()
