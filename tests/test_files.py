"""headstart.files: the one reader of row files and the one crash-safe JSON-lines log."""

from __future__ import annotations

import gzip
import json

import pytest

from headstart.files import append_jsonl, iter_raw_rows, iter_rows, read_json_file, read_jsonl, write_jsonl


def test_every_format_gives_the_same_rows(tmp_path):
    rows = [{"id": 1, "text": "é"}, {"id": 2, "text": "b"}]
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "a.jsonl").write_text(lines + "\n")  # a blank line is no row
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "lines.json").write_text(lines)  # a .json file of JSON lines
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    for name in ("a.jsonl", "a.json", "lines.json", "a.jsonl.gz"):
        assert list(iter_rows(tmp_path / name)) == rows, name


def test_the_strict_reader_names_the_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=rf"{path}:3: not a JSON line"):
        list(iter_rows(path))
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=rf"{path}:2: not a JSON object: \[1, 2\]"):
        list(iter_rows(path))
    path.write_bytes(b'{"a": 1}\n' + bytes(range(256)))
    with pytest.raises(ValueError, match=rf"{path}: not UTF-8 text \(line 3, byte 137\)"):
        list(iter_rows(path))
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="not a readable gzip file"):
        list(iter_rows(tmp_path / "bad.jsonl.gz"))
    with pytest.raises(FileNotFoundError, match="data file not found"):
        list(iter_rows(tmp_path / "absent.jsonl"))


def test_a_json_file_that_is_not_utf8_or_not_json_is_named_with_its_line(tmp_path):
    """A dataset's dataset_dict.json or state.json, a DeepSpeed config: read whole. Their
    UnicodeDecodeError (a ValueError) used to end as `error: 'utf-8' codec can't decode byte
    0xff in position 15`, naming no file."""
    path = tmp_path / "state.json"
    path.write_bytes(b'{\n "splits": ["train",\n  "valid\xffation"]}\n')
    with pytest.raises(ValueError, match=rf"^{path}: not UTF-8 text \(line 3, byte 31\)"):
        read_json_file(path)
    path.write_text('{\n "splits": ["train",\n}\n')
    with pytest.raises(ValueError, match=rf"^{path}: not JSON \(line 3, column 1: Expecting value\)$"):
        read_json_file(path)
    path.write_text('{"splits": ["train"]}')
    assert read_json_file(path) == {"splits": ["train"]}


def test_the_tolerant_reader_reports_each_bad_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe\n{"a": \n"text"\n{"a": 2}')
    found = [(row.number, row.data, row.error) for row in iter_raw_rows(path)]
    assert found == [(1, {"a": 1}, None), (2, None, "invalid_utf8"), (3, None, "malformed_json"),
                     (4, None, "malformed_json"), (5, {"a": 2}, None)]


def test_a_line_cut_by_a_crash_is_dropped_and_never_merges_with_the_next(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"n": 1}, {"n": 2}])
    with path.open("a") as handle:
        handle.write('{"n": 3, "cut')  # a kill mid-write
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}]
    append_jsonl(path, [{"n": 3}])
    assert read_jsonl(path) == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert path.read_text().count("\n") == 3


def test_a_bad_line_before_the_last_is_damage_named_not_dropped(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"n": 1\n{"n": 2}\n')
    with pytest.raises(ValueError, match=r"log.jsonl:1: not a JSON record"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "log.jsonl"
    append_jsonl(path, [{"n": 1}])
    write_jsonl(path, [{"n": 2}, {"n": 3}])
    assert read_jsonl(path) == [{"n": 2}, {"n": 3}]
    assert not (tmp_path / "log.jsonl.partial").exists()
