"""The evaluator's settings: one recipe under headstart/recipes/eval/, overridable per key."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import OmegaConf

from eval.engines.decode import DecodeSpec
from eval.evaluation.shards import parse_shard
from eval.evaluation.typing_sim import check_typing
from headstart.config import check_range, config_from_dict, config_to_dict
from headstart.prompts import check_evaluation_system_setting
from headstart.run_config import AdaptedModelOnDevice, ModelOnDevice
from headstart.vllm_settings import VLLMSettings

BACKENDS = ("transformers", "vllm")
MOST_BATCHED = 65_536  # a typo guard on fast_batch_size
MOST_CPU_SECONDS = 3_600  # one executed program


@dataclass
class EvaluationSettings(ModelOnDevice):
    """What every evaluation shares: `python -m eval`'s and before/after's keys, declared once."""

    decode: DecodeSpec = field(
        default_factory=DecodeSpec,
        metadata={"help": "Decoder, acceptance rule, answer length, regeneration mode (eval.engines.decode)."},
    )
    backend: str = field(
        default="transformers",
        metadata={"help": "Fast path drafting on 'transformers' or 'vllm' (drafts, verify passes and regeneration; the same "
                          "tokens up to floating-point near-ties, so the same forward counts); baselines and the timed "
                          "residual phase stay on transformers at batch 1."},
    )
    fast_batch_size: int = field(
        default=32,
        metadata={"help": "Fast path batch: prefixes decoded together (greedy), or requests per round (other rules); with "
                          "backend=vllm, what one vLLM call gets (raise it: vLLM schedules its own batches)."},
    )
    timed_every: int = field(
        default=1,
        metadata={"help": "Count mode: decode and time the baselines and the final update at batch 1 for every N-th request "
                          "(positions 0, N, 2N, ... of the selection); the others are counted from greedy drafts of S_1..S_n "
                          "decoded in batches (the same counts, no wall clock; greedy acceptance, AR fast path). 1: time all."},
    )
    typing: str | None = field(
        default=None,
        metadata={"help": "Typing-time simulation (eval.evaluation.typing_sim): 'cpm:N' (N characters per minute), "
                          "'unlimited', or a keystroke trace file (seconds per character, one a line); null: off."},
    )
    typing_policy: str = field(
        default="finish",
        metadata={"help": "Typing simulation: a segment arriving mid-update 'finish'es the update first or 'abandon's it for "
                          "the newest segment."},
    )
    data_paths: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "Local data per benchmark name, e.g. {mbpp: path} (a suite's or before/after's `data_path`s)."},
    )
    shard: str | None = field(
        default=None,
        metadata={"help": "INDEX/COUNT: evaluate only the requests at positions INDEX, INDEX+COUNT, ... of the selection "
                          "(of every side and benchmark), into output_dir/shards/INDEX-of-COUNT (eval.evaluation.shards), no "
                          "report; the same run without shard merges them and reports. null: all."},
    )

    def __post_init__(self) -> None:
        parse_shard(self.shard)
        check_range("fast_batch_size", self.fast_batch_size, 1, MOST_BATCHED)
        check_timed_every(self.timed_every, self.decode)
        super().__post_init__()  # dtype, device
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        if self.backend == "vllm" and not self.decode.fast:
            raise ValueError(f"backend=vllm drafts on the fast path; decode.engine={self.decode.engine} runs on transformers "
                             "(use decode.engine=auto, or backend=transformers)")
        if self.typing is not None:
            check_typing(self.typing, self.typing_policy, self.decode)


@dataclass
class EvalConfig(EvaluationSettings, AdaptedModelOnDevice):
    """Streaming evaluation of one model on one benchmark."""

    benchmark: str = field(default="humaneval", metadata={"help": "Benchmark name (see eval.benchmarks.BENCHMARKS)."})
    data_path: str | None = field(
        default=None,
        metadata={"help": "Local copy of the benchmark data instead of its default source."},
    )
    limit: int | None = field(
        default=None,
        metadata={"help": "Evaluate only the first N requests (with n >= 2 segments); null: all; 0: check only (settings, "
                          "data, model source, output_dir), evaluate and write nothing."},
    )
    vllm: VLLMSettings = field(
        default_factory=VLLMSettings,
        metadata={"help": "backend=vllm: the engines' settings (headstart.vllm_settings.VLLMSettings)."},
    )
    record_tokens: bool = field(
        default=False,
        metadata={"help": "Also store each request's drafts D_1..D_{n-1} and both answers as token ids (offline replays, e.g. "
                          "benchmarks/bench_lookup_policy.py)."},
    )
    sandbox_cpu_seconds: int | None = field(
        default=None,
        metadata={"help": "CPU-time limit of each executed program; default the benchmark's own."},
    )
    benchmarks: list[str] = field(
        default_factory=list,
        metadata={"help": "Suite: benchmarks run in turn into one report (empty: just `benchmark`)."},
    )
    acceptances: list[str] = field(
        default_factory=list,
        metadata={"help": "Suite: acceptance rules run in turn (empty: just `decode.acceptance`)."},
    )
    report_only: bool = field(
        default=False,
        metadata={"help": "Suite: rebuild the report from the results already written (requests every rule has finished); "
                          "compute nothing."},
    )
    output_dir: str | None = field(
        default=None,
        metadata={"help": "Where results.jsonl and summary.json go; default outputs/eval/<benchmark>-<model>-<acceptance>."},
    )

    def __post_init__(self) -> None:
        check_limit(self.limit)
        # Each of these used to be found only once the model had loaded (minutes for an 8B model).
        self.system_prompt = check_evaluation_system_setting(self.system_prompt)
        super().__post_init__()
        check_model_len(self.vllm.max_model_len, self.decode.max_new_tokens)
        if self.sandbox_cpu_seconds is not None:
            check_range("sandbox_cpu_seconds", self.sandbox_cpu_seconds, 1, MOST_CPU_SECONDS, "the benchmark's own")
        if self.shard is not None and self.report_only:
            raise ValueError("report_only reports merged results; run without shard (that merges the shards)")


def decode_with(decode: DecodeSpec, overrides: str) -> DecodeSpec:
    """`decode` with space-separated `key=value` overrides ("lookup_match=longest lookup_tree=8"),
    validated as a recipe's would be (the benchmarks' `--policy`).

    Args:
        decode (DecodeSpec): the decode settings to start from (left unchanged).
        overrides (str): space-separated `key=value` pairs of `DecodeSpec` fields.
    """
    values = OmegaConf.to_container(OmegaConf.from_dotlist(overrides.split()))
    return config_from_dict(DecodeSpec, config_to_dict(decode) | values)


def check_timed_every(timed_every: int, decode: DecodeSpec) -> None:
    """Counting without timing needs every count to follow from greedy drafts: greedy acceptance on the AR fast path.

    Args:
        timed_every (int): every how many requests one is decoded and timed (1: all).
        decode (DecodeSpec): the decode settings.
    """
    check_range("timed_every", timed_every, 1)
    if timed_every > 1 and not (decode.fast and decode.rule.lossless):
        raise ValueError(f"timed_every={timed_every} counts requests from greedy drafts: it needs decode.acceptance=greedy "
                         f"and the AR fast path (decode.engine=auto or fast), not acceptance={decode.acceptance}, "
                         f"engine={decode.engine}; use timed_every=1")


def check_model_len(max_model_len: int | None, max_new_tokens: int) -> None:
    """Refuse a `vllm.max_model_len` that cannot hold an answer and a prompt, before the model loads
    (the exact need, longest prompt + answer + 1, is checked once the prompts are tokenized)."""
    if max_model_len is not None and max_model_len < max_new_tokens + 2:
        raise ValueError(f"vllm.max_model_len={max_model_len} cannot hold a prompt and decode.max_new_tokens="
                         f"{max_new_tokens} answer tokens plus a verify position: it must be >= {max_new_tokens + 2} "
                         "(null: what the run needs)")


def check_limit(limit: int | None, minimum: int = 1) -> None:
    """`limit` is null (every request), 0 (check only: nothing evaluated, nothing
    written) or at least `minimum`; a negative one used to drop the last requests.

    Args:
        limit (int | None): how many requests to evaluate (the first ones); None: all.
        minimum (int): the fewest requests a nonzero limit may ask for.
    """
    if limit is not None and limit != 0 and limit < minimum:
        raise ValueError(f"limit must be null (every request), 0 (check only) or >= {minimum}, not {limit}")
