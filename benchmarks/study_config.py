"""The adaptation study's settings (benchmarks/study_adaptation.py runs it, study_report.py
writes its report; both import this module, which imports neither)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from eval.benchmarks import BENCHMARKS
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig, check_limit
from headstart.paths import outputs_dir
from headstart.prompts import check_evaluation_system_setting
from headstart.run_config import ModelSetting


@dataclass
class StudyConfig(ModelSetting):
    """The base model against each objective at equal compute, on an embedded model."""

    data_recipe: str = field(default="smollm2_code_self", metadata={"help": "Data-builder recipe of the training rows."})
    # One by default: a recipe's mapping is merged into the default's keys, so a default
    # objective could not be left out (study_smollm2 lists its three).
    objectives: dict[str, str] = field(default_factory=lambda: {"sft": "smollm2_prefix"},
                                       metadata={"help": "Side name -> train recipe (its objective and LoRA are used)."})
    learning_rates: list[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3],
                                        metadata={"help": "Rates swept per objective on the validation split."})
    sweep_steps: int = field(default=20, metadata={"help": "Optimizer steps of each sweep run."})
    max_steps: int = field(default=120, metadata={"help": "Optimizer steps of each final run (equal for every objective)."})
    objective_steps: dict[str, int] = field(
        default_factory=dict,
        metadata={"help": "Steps of an objective's final run where it differs from max_steps, e.g. {sdft: 100}: on-policy "
                          "drafting costs far more per step, and the budget is wall clock per objective."},
    )
    curve_points: int = field(default=3, metadata={"help": "Checkpoints on the learning curve (the last is the final adapter)."})
    checkpoint_steps: int = field(
        default=20,
        metadata={"help": "At most this many optimizer steps between a final run's checkpoints (a killed run resumes from the "
                          "last; the curve's are among them)."},
    )
    effective_batch_size: int = field(default=8, metadata={"help": "Rows per optimizer step."})
    per_device_train_batch_size: int = field(default=2, metadata={"help": "Rows per micro-step."})
    max_length: int = field(
        default=512,
        metadata={"help": "Tokens per row: the data build's caps.max_tokens (requests "
                          "whose prompt and answer cap exceed it are not built) and training's max_length."},
    )
    benchmarks: list[str] = field(default_factory=lambda: ["humaneval", "mbpp"], metadata={"help": "Evaluated benchmarks."})
    data_paths: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "Local data per benchmark, e.g. {mbpp: path}; those of benchmarks not evaluated are not read."},
    )
    limit: int | None = field(default=None, metadata={"help": "Requests per benchmark (the first N test problems); null: all."})
    backend: str = field(default=EvalConfig.backend, metadata={"help": "Fast-path drafting backend of every evaluation."})
    fast_batch_size: int = field(default=EvalConfig.fast_batch_size,
                                 metadata={"help": "Prefixes decoded together (raise it with backend=vllm)."})
    timed_every: int = field(
        default=EvalConfig.timed_every,
        metadata={"help": "Count mode of every evaluation (EvalConfig.timed_every): time every N-th request, count the "
                          "others from batched greedy drafts; 1: time all."},
    )
    curve_benchmark: str = field(default="humaneval", metadata={"help": "Benchmark of the learning curve."})
    curve_limit: int | None = field(
        default=None,
        metadata={"help": "Requests per curve point: the first N of the report's, at most limit (every point, base and final "
                          "included, on the same N); null: limit."},
    )
    merge_for_eval: bool = field(
        default=True,
        metadata={"help": "Evaluate each adapter merged into the base weights (float32, train.merge): drafting then runs a "
                          "plain model (vLLM on a CPU drafts through its LoRA about 2x slower)."},
    )
    decode: DecodeSpec = field(default_factory=DecodeSpec, metadata={"help": "Decode settings of every evaluation."})
    system_prompt: str = field(
        default="incomplete",
        metadata={"help": "System message of the training rows (data.system_message) and of every evaluated side: "
                          "incomplete (headstart's incomplete-request message), none, or literal text."},
    )
    threads: int = field(default=2, metadata={"help": "Torch threads for training and evaluation."})
    output_dir: str = field(default=str(outputs_dir("study", "smollm2")), metadata={"help": "Everything the study writes."})
    wandb_group: str | None = field(default=None, metadata={"help": "W&B group of every run; default study-<output dir name>."})

    def __post_init__(self) -> None:
        if self.curve_benchmark not in self.benchmarks:
            raise ValueError(f"curve_benchmark={self.curve_benchmark!r} is not in benchmarks {self.benchmarks}")
        unknown = sorted((set(self.benchmarks) | set(self.data_paths)) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"benchmarks or data_paths name {unknown}, not benchmarks ({', '.join(sorted(BENCHMARKS))})")
        unknown = sorted(set(self.objective_steps) - set(self.objectives))
        if unknown:
            raise ValueError(f"objective_steps names {unknown}, not objectives of the study ({', '.join(self.objectives)})")
        if not 1 <= self.curve_points <= min(map(self.steps, self.objectives)) or min(self.sweep_steps,
                                                                                          self.checkpoint_steps) < 1:
            raise ValueError("need 1 <= curve_points <= every objective's steps, sweep_steps >= 1 and checkpoint_steps >= 1")
        if self.curve_limit is not None and self.curve_limit < 1:
            raise ValueError(f"curve_limit={self.curve_limit} must be at least 1 (or null: limit)")
        check_limit(self.limit)
        self.system_prompt = check_evaluation_system_setting(self.system_prompt)
        if self.system_prompt == "model":  # the base side has no training record to read it from
            raise ValueError("system_prompt=model: the study trains with and evaluates every side on one system message; "
                             "choose incomplete, none or literal text")
        for objective in self.objectives:
            if self.steps(objective) % self.curve_points:
                raise ValueError(f"{objective}: {self.steps(objective)} steps must be a multiple of "
                                 f"curve_points={self.curve_points}")
        if not self.learning_rates or "before" in self.objectives:
            raise ValueError("learning_rates must not be empty; 'before' is the base model's side, not an objective")

    def steps(self, objective: str) -> int:
        """Optimizer steps of an objective's final run."""
        return self.objective_steps.get(objective, self.max_steps)

    def save_steps(self, objective: str) -> int:
        """Steps between the final run's checkpoints: at most checkpoint_steps, and dividing the curve's spacing."""
        return math.gcd(self.checkpoint_steps, self.steps(objective) // self.curve_points)

    @property
    def curve_requests(self) -> int | None:
        """Requests per curve point: curve_limit, never more than limit (None: all)."""
        limits = [n for n in (self.curve_limit, self.limit) if n is not None]
        return min(limits) if limits else None

    @property
    def group(self) -> str:
        return self.wandb_group or f"study-{Path(self.output_dir).name}"
