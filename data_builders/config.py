"""The schema of a data-builder recipe (`headstart/recipes/data/*.yaml`), in TRL's help-per-field style."""

from __future__ import annotations

from dataclasses import dataclass, field

from headstart.benchmark_registry import EVALUATION_SETS
from headstart.run_config import DeviceSetting, ModelSetting, PromptFormatSetting
from headstart.vllm_settings import VLLMSettings


@dataclass
class SourceSpec:
    """Where one corpus comes from: a local file (`path`) or the hub (`hub_id`)."""

    path: str | None = field(default=None, metadata={"help": "Local json/jsonl/jsonl.gz/parquet file; overrides the hub id."})
    hub_id: str | None = field(default=None, metadata={"help": "Hub dataset id; null means the source's default."})
    split: str | None = field(default=None, metadata={"help": "Hub split; null means the source's default."})
    max_rows: int = field(default=0, metadata={"help": "Read at most this many input rows (0: all)."})


@dataclass
class FilterConfig:
    languages: list[str] = field(default_factory=lambda: ["English"], metadata={"help": "LMSYS `language` values kept."})
    min_segments: int = field(
        default=2,
        metadata={"help": "Requests with fewer segments are dropped (n = 1 has nothing to stream)."},
    )
    max_request_chars: int = field(default=16000, metadata={"help": "Longer requests are absurd and skipped."})
    max_answer_chars: int = field(default=32000, metadata={"help": "Longer reference answers are absurd and skipped."})
    mbpp_splits: list[str] = field(
        default_factory=lambda: ["train"],
        metadata={"help": "MBPP splits read: train, validation, prompt (never test, which is evaluated)."},
    )


@dataclass
class CapConfig:
    max_pairs_per_request: int = field(
        default=0,
        metadata={"help": "Prefixes kept per request, evenly spaced, always the last (0: all)."},
    )
    max_tokens: int = field(
        default=2048,
        metadata={"help": "Longest prompt+draft+answer in tokens (0: no limit, no tokenizer needed)."},
    )
    max_pairs: int = field(default=0, metadata={"help": "Total pairs over both splits (0: no cap)."})


@dataclass
class DecontaminationConfig:
    benchmarks: list[str] = field(
        default_factory=lambda: list(EVALUATION_SETS),
        metadata={"help": "Evaluation sets (headstart.benchmark_registry) whose texts must not leak into training data."},
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Folder holding the benchmark files (mbpp/, canitedit/, ...); null: the vendored headstart/data/."},
    )
    hub: bool = field(
        default=True,
        metadata={"help": "Read a benchmark that has no file in data_dir from the hub (false: it is missing)."},
    )
    extra_files: list[str] = field(
        default_factory=list,
        metadata={"help": "More files as `path:field1,field2` (jsonl/json/.gz)."},
    )
    ngram: int = field(default=13, metadata={"help": "Word n-gram length for overlap detection."})
    on_missing: str = field(
        default="error",
        metadata={"help": "A benchmark file that is absent: error or skip (recorded in the card)."},
    )


@dataclass
class GenerationConfig(PromptFormatSetting, DeviceSetting):
    backend: str = field(
        default="auto",
        metadata={"help": "auto (vLLM when its environment exists and a GPU is present), transformers or vllm."},
    )
    batch_size: int = field(
        default=8,
        metadata={"help": "Prompts per generation batch (one cache write each); with vLLM, what one call gets (raise it: vLLM "
                          "schedules its own batches)."},
    )
    max_new_tokens: int = field(default=512, metadata={"help": "Longest generated answer or draft."})
    completion_frame: str = field(
        default="transcript",
        metadata={"help": "The frame of a base model's requests and rows (headstart.completion.FRAMES): the evaluated "
                          "benchmark's, e.g. docstring for MBPP, so the model is trained on prompts as it is evaluated."},
    )
    cache_files: list[str] = field(
        default_factory=list,
        metadata={"help": "Read-only answer caches consulted before generating."},
    )
    vllm: VLLMSettings = field(
        default_factory=VLLMSettings,
        metadata={"help": "backend=vllm: tensor_parallel_size, data_parallel_size and the engines' other settings "
                          "(headstart.vllm_client)."},
    )


@dataclass
class BuildConfig(ModelSetting):
    name: str = field(default="dataset", metadata={"help": "Dataset name; the default output is outputs/data/NAME."})
    sources: list[str] = field(
        default_factory=lambda: ["lmsys"],
        metadata={"help": "Corpora to read: lmsys, mbpp, magicoder, evol_codealpaca, embedded."},
    )
    lmsys: SourceSpec = field(default_factory=SourceSpec, metadata={"help": "LMSYS-Chat-1M location."})
    mbpp: SourceSpec = field(
        default_factory=SourceSpec,
        metadata={"help": "MBPP location (the full release; filters.mbpp_splits picks the ids)."},
    )
    magicoder: SourceSpec = field(default_factory=SourceSpec, metadata={"help": "Magicoder-OSS-Instruct-75K location."})
    evol_codealpaca: SourceSpec = field(default_factory=SourceSpec, metadata={"help": "Evol-CodeAlpaca location."})
    embedded: SourceSpec = field(
        default_factory=lambda: SourceSpec(path="data_builders/embedded/requests.jsonl"),
        metadata={"help": "The requests shipped with the project."},
    )
    format: str = field(default="ar", metadata={"help": "ar (TRL conversational `messages`) or refusion (`query`, `response`)."})
    pairs: str = field(default="prefix_to_answer", metadata={"help": "prefix_to_answer or draft_refinement (refusion only)."})
    answers: str = field(
        default="reference",
        metadata={"help": "reference (the corpus's answer) or self (the model's greedy answer)."},
    )
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer for token caps and statistics; null: the model's."})
    filters: FilterConfig = field(default_factory=FilterConfig, metadata={"help": "Which requests are eligible."})
    caps: CapConfig = field(default_factory=CapConfig, metadata={"help": "Size limits."})
    decontamination: DecontaminationConfig = field(
        default_factory=DecontaminationConfig,
        metadata={"help": "Benchmark leak filter."},
    )
    generation: GenerationConfig = field(default_factory=GenerationConfig, metadata={"help": "Self-distillation settings."})
    seed: int = field(default=0, metadata={"help": "Seed of request order, selection and split."})
    validation_fraction: float = field(default=0.05, metadata={"help": "Share of requests (not pairs) in the validation split."})
    num_proc: int = field(default=1, metadata={"help": "Worker processes for datasets.map passes."})
    preview_rows: int = field(default=20, metadata={"help": "Rows of train written to preview.jsonl."})
    output_dir: str | None = field(default=None, metadata={"help": "Where the dataset goes; null: outputs/data/NAME."})
    work_dir: str | None = field(default=None, metadata={"help": "Resumable intermediate files; null: OUTPUT_DIR.work."})
    keep_work_dir: bool = field(
        default=True,
        metadata={"help": "Keep intermediates (and the answer cache) after a successful build."},
    )
