"""The adaptation study's settings (benchmarks/study_adaptation.py runs it, study_report.py
writes its report; both import this module, which imports neither)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.before_after import BeforeAfterConfig
from headstart.config import config_from_dict
from headstart.paths import outputs_dir
from headstart.run_config import ModelSetting

# What the study gives every run itself (its sides, steps, rates and paths), refused in `train:` and `eval:`.
STUDY_SETS_TRAIN = ("model.name_or_path", "data.path", "data.system_message", "training.output_dir",
                    "training.learning_rate", "training.max_steps", "training.save_steps", "training.save_total_limit",
                    "training.eval_steps", "training.run_name", "run.merge")
STUDY_SETS_EVAL = ("model", "adapted", "more_adapted", "output_dir", "wandb_group")


def dotted(values: dict[str, Any], prefix: str = "") -> list[str]:
    """A nested mapping as `a.b=value` arguments (values in JSON, which the command line reads as YAML)."""
    arguments = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            arguments += dotted(value, f"{prefix}{key}.")
        else:
            arguments.append(f"{prefix}{key}={json.dumps(value)}")
    return arguments


def dotted_keys(values: dict[str, Any]) -> set[str]:
    return {argument.split("=", 1)[0] for argument in dotted(values)}


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
    train: dict[str, Any] = field(
        default_factory=lambda: {"run": {"effective_batch_size": 8},
                                 "training": {"per_device_train_batch_size": 2, "max_length": 512}},
        metadata={"help": "Train-recipe settings of every training run, under train/sft.py's keys (e.g. {training: "
                          "{max_length: 512}}); training.max_length also caps the data build. The study sets "
                          f"{', '.join(STUDY_SETS_TRAIN)}."},
    )
    eval: dict[str, Any] = field(
        default_factory=lambda: {"benchmarks": ["humaneval", "mbpp"], "limit": None, "system_prompt": "incomplete"},
        metadata={"help": "Before/after settings of every evaluation, under eval.before_after's keys (benchmarks, "
                          "data_paths, limit, decode, backend, timed_every, ...); its system_prompt is also the training "
                          f"rows' data.system_message. The study sets {', '.join(STUDY_SETS_EVAL)}."},
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
    threads: int = field(default=2, metadata={"help": "Torch threads for training and evaluation."})
    output_dir: str = field(default=str(outputs_dir("study", "smollm2")), metadata={"help": "Everything the study writes."})
    wandb_group: str | None = field(default=None, metadata={"help": "W&B group of every run; default study-<output dir name>."})

    def __post_init__(self) -> None:
        for name, sets, given in (("train", STUDY_SETS_TRAIN, dotted_keys(self.train)),
                                  ("eval", STUDY_SETS_EVAL, set(self.eval))):
            if taken := sorted(given & set(sets)):
                raise ValueError(f"{name}: {', '.join(taken)} is set by the study; leave it out")
        evaluation = self.evaluation
        if self.curve_benchmark not in evaluation.benchmarks:
            raise ValueError(f"curve_benchmark={self.curve_benchmark!r} is not in eval.benchmarks {evaluation.benchmarks}")
        unknown = sorted(set(self.objective_steps) - set(self.objectives))
        if unknown:
            raise ValueError(f"objective_steps names {unknown}, not objectives of the study ({', '.join(self.objectives)})")
        if not 1 <= self.curve_points <= min(map(self.steps, self.objectives)) or min(self.sweep_steps,
                                                                                          self.checkpoint_steps) < 1:
            raise ValueError("need 1 <= curve_points <= every objective's steps, sweep_steps >= 1 and checkpoint_steps >= 1")
        if self.curve_limit is not None and self.curve_limit < 1:
            raise ValueError(f"curve_limit={self.curve_limit} must be at least 1 (or null: limit)")
        if evaluation.system_prompt == "model":  # the base side has no training record to read it from
            raise ValueError("eval.system_prompt=model: the study trains with and evaluates every side on one system "
                             "message; choose incomplete, none or literal text")
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
    def evaluation(self) -> BeforeAfterConfig:
        """The before/after settings of every evaluation (`eval:`), the base model's; the study adds the
        adapted sides."""
        return config_from_dict(BeforeAfterConfig, {**self.eval, "model": self.model, "wandb_group": self.group,
                                                     "output_dir": str(Path(self.output_dir) / "report")})

    def train_overrides(self) -> list[str]:
        """`train:` as train/sft.py's `key=value` arguments, the evaluation's system message with them."""
        return [*dotted(self.train), f"data.system_message={json.dumps(self.evaluation.system_prompt)}"]

    @property
    def curve_requests(self) -> int | None:
        """Requests per curve point: curve_limit, never more than eval.limit (None: all)."""
        limits = [n for n in (self.curve_limit, self.evaluation.limit) if n is not None]
        return min(limits) if limits else None

    @property
    def group(self) -> str:
        return self.wandb_group or f"study-{Path(self.output_dir).name}"
