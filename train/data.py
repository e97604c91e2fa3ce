"""Training data: load a conversational dataset, by path or hub id, and check its rows.

Rows hold a `messages` list (system, user prefix, assistant answer), or, as the
ReFusion data builds write them, a `query` (the prefix) and a `response` (the
answer), plus a `draft` in draft-refinement builds; `objective: distill` also
needs each row's complete request in a `full_request` column. Tokenizing them is
`train.tokenization`; who wrote the answers, `train.provenance`.
"""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

from headstart.files import iter_rows, read_json_file, require_file
from headstart.fingerprint import file_sha256, files_sha256, tree_sha256
from headstart.paths import is_default_output

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_split(path: str, split: str) -> Dataset | None:
    """One split of a dataset stored anywhere we accept; None when the split is absent.
    An empty file or split, or a line that is not JSON, is an error naming it.

    Args:
        path (str): a data file, a saved dataset's directory or a hub dataset id.
        split (str): the split's name ("train", "validation").
    """
    local = Path(path).expanduser()
    if local.suffix in FILE_FORMATS:
        require_file(local)
    present = has_split(path, split)
    if present is False:
        return None
    if local.suffix in FILE_FORMATS:
        return _nonempty(_load_file(local), path, split)
    if local.is_dir():
        listed = (local / "dataset_dict.json").is_file()  # a DatasetDict: each split is read on its own
        return _nonempty(_load_saved(local / split if listed else local, path, split), path, split)
    if path.startswith((".", "/", "~")) or is_default_output(path):
        raise FileNotFoundError(f"dataset not found: {path} (build it first, e.g. python -m data_builders)")
    try:
        return load_dataset(path, split=split)
    except ValueError as error:  # datasets raises ValueError for an unknown split
        if "split" in str(error).lower():
            return None
        raise


def has_split(path: str, split: str) -> bool | None:
    """Whether a local dataset holds `split`, from its listing alone (a single file or a bare saved
    dataset holds `train` only); None for anything else (a hub id, a path not there): known once read.

    Args:
        path (str): a data file, a saved dataset's directory or a hub dataset id.
        split (str): the split's name.
    """
    local = Path(path).expanduser()
    if local.suffix in FILE_FORMATS and local.is_file():
        return split == "train"  # a single file holds one split: it is the training split, there is no other
    if local.is_dir():
        listing = local / "dataset_dict.json"
        return split in read_json_file(listing).get("splits", []) if listing.is_file() else split == "train"
    return None


def data_fingerprint(path: str) -> str:
    """What a run is trained from, by content: "sha256:<hex>" of a data file's bytes, or of a
    saved dataset's rows (its .arrow files and split list: `save_to_disk` also writes a random
    fingerprint into state.json, which a rebuild of the same rows changes; `cache-*.arrow` are
    the caches `datasets` writes beside them when a run maps the rows); a hub id is named,
    "hub:<id>" (the hub resolves it). Reads no dataset.

    Args:
        path (str): a data file, a saved dataset's directory or a hub dataset id.
    """
    local = Path(path).expanduser()
    if local.is_file():
        return "sha256:" + file_sha256(local)
    if local.is_dir():
        rows = sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith("cache-")
                      and (p.suffix == ".arrow" or p.name == "dataset_dict.json"))
        if not rows:
            return "sha256:" + tree_sha256(local)
        return "sha256:" + files_sha256([(str(p.relative_to(local)), p) for p in rows])
    return f"hub:{path}"


def _load_file(path: Path) -> Dataset:
    """A .jsonl/.json/.parquet file through `datasets`; its errors (an empty file: a bare
    StopIteration; a bad line: DatasetGenerationError) become the file and line at fault."""
    if FILE_FORMATS[path.suffix] == "json" and next(iter_rows(path), None) is None:
        raise ValueError(f"{path}: the file holds no rows (empty)")
    try:
        return load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    except Exception as error:
        if FILE_FORMATS[path.suffix] == "json":
            for _ in iter_rows(path):  # names the first line that is not a JSON object
                pass
        raise ValueError(f"{path}: cannot be read as a {path.suffix} dataset ({type(error).__name__}: {error})") from error


def _load_saved(directory: Path, path: str, split: str) -> Dataset:
    """A split written by `save_to_disk`. One without rows has no data file, and
    `load_from_disk` fails on it (and on the whole DatasetDict) with an IndexError."""
    state = directory / "state.json"
    if state.is_file() and not read_json_file(state).get("_data_files"):
        raise ValueError(f"{path}: split {split!r} holds no rows")
    try:
        stored = load_from_disk(str(directory))
    except Exception as error:
        raise ValueError(f"{path}: cannot be read as a saved dataset ({type(error).__name__}: {error})") from error
    if isinstance(stored, DatasetDict):
        raise ValueError(f"{directory}: a DatasetDict inside a split directory")
    return stored


def _nonempty(dataset: Dataset, path: str, split: str) -> Dataset:
    if len(dataset) == 0:
        raise ValueError(f"{path}: split {split!r} holds no rows")
    return dataset


def check_rows(dataset: Dataset, split: str) -> None:
    """Every row is a dialogue ending with an assistant answer: a `messages` list of
    {role, content} turns, or `query` and `response` strings. The error names the row
    (counting from 1) and the field.

    Args:
        dataset (Dataset): the rows to check.
        split (str): the split's name, for the message.
    """
    columns = dataset.column_names
    fields = ("messages",) if "messages" in columns else ("query", "response")
    for number, row in enumerate(dataset.select_columns(list(fields)), 1):
        where = f"{split} row {number} (counting from 1)"
        if fields == ("messages",):
            messages = row["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"{where}: field `messages` is missing or empty")
            for turn in messages:
                if not (isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)):
                    raise ValueError(f"{where}: every turn of `messages` needs a `role` and a `content` string; got {turn!r}")
            if messages[-1]["role"] != "assistant":
                raise ValueError(f"{where}: the dialogue must end with an assistant turn (the answer)")
        else:
            for name in fields:
                if not isinstance(row[name], str):
                    raise ValueError(f"{where}: field `{name}` is missing or not a string")
