"""The training recipe schema: what `headstart/recipes/train/*.yaml` may say.

One dataclass per headstart section, each field with a one-line help, in TRL's style;
the loader (`headstart.config.load_config`) rejects keys they do not declare. The
`training:` section is TRL's own `SFTConfig` under its field names (as alignment-handbook's
recipes give them), with headstart's defaults as the fields of `HeadstartSFTConfig`
(train/sft_config.py, which checks its keys); the `model:` and `lora:` sections reach TRL
as its `ModelConfig` (train/model.py). The defaults are the embedded CPU default
(`smollm2_prefix`), so a bare `train/sft.py` run trains SmolLM2-135M in minutes without
network. Checks of the values: train/recipe.py; the batch plan: train/batch.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headstart.config import RecipeError
from headstart.paths import outputs_dir
from headstart.run_config import DtypeSetting, PromptFormatSetting

OBJECTIVES = ("sft", "refusion", "distill", "sdft")
# The trackers train/sft.py configures (train/tracking.py); none: no tracker.
TRACKERS = ("tensorboard", "wandb", "none")
DIVERGENCES = ("forward", "reverse")
# TRL SDFTConfig.distillation_mode values.
SDFT_MODES = ("topk_logits", "full_logits", "sampled_token")
# RefusionSection.clean_average and .over_long values (train/refusion_objective.py, train/splits.py).
CLEAN_AVERAGES = ("batch", "example")
OVER_LONG = ("skip", "cut")


@dataclass
class ModelSection(DtypeSetting, PromptFormatSetting):
    """The base model (`dtype` unset: bf16 on GPU, fp32 on CPU, and fp32 wherever every weight trains)."""

    name_or_path: str = field(
        default="smollm2", metadata={"help": "base model: embedded name (smollm2), hub id, local dir or .gguf file"}
    )
    attn_implementation: str = field(default="sdpa", metadata={"help": "attention kernel passed to from_pretrained"})
    use_peft: bool = field(
        default=True,
        metadata={"help": "train the `lora:` adapter (TRL's ModelConfig.use_peft); false: every weight trains "
                          "(objective sft or refusion) and merged/ holds the trained model, with no adapter/"},
    )

    def __post_init__(self) -> None:
        if self.dtype == "auto":  # the spelling of unset in recipes and saved runs before `dtype` was shared
            self.dtype = None


@dataclass
class DataSection:
    path: str = field(
        default=str(outputs_dir("data", "embedded_prefix")),
        metadata={"help": "save_to_disk dir, .jsonl/.json/.parquet file, or hub id with a `messages` column"},
    )
    train_split: str = field(default="train", metadata={"help": "split to train on"})
    eval_split: str | None = field(default="validation", metadata={"help": "split to evaluate on (skipped if absent)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "keep only the first N training rows"})
    max_eval_samples: int | None = field(default=64, metadata={"help": "keep only the first N evaluation rows"})
    system_message: str = field(
        default="incomplete",
        metadata={"help": "system turn (headstart.prompts): incomplete (the headstart message), model (the base's recorded "
                          "one, else none), none (the template's default), dataset (keep rows'), or literal text"},
    )
    answers_from_other_model: bool = field(
        default=False,
        metadata={"help": "train on answers another model wrote (the rows' answer_model); false: such data is refused"},
    )


@dataclass
class LoraSection:
    r: int = field(default=8, metadata={"help": "LoRA rank"})
    alpha: int = field(default=16, metadata={"help": "LoRA alpha (scale = alpha / r)"})
    dropout: float = field(default=0.05, metadata={"help": "dropout on the LoRA input"})
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "module names that get adapters (the attention projections)"},
    )
    target_regex: str | None = field(
        default=None, metadata={"help": "full-name regex used instead of target_modules (e.g. text tower only)"}
    )


@dataclass
class RunSection:
    """headstart's own settings of a run: how the batch is split, and what happens around training."""

    effective_batch_size: int = field(
        default=4, metadata={"help": "sequences per optimizer step = world size x per-device batch x accumulation"}
    )
    keep_effective_batch: bool = field(
        default=False,
        metadata={"help": "refuse a world size that cannot keep effective_batch_size (the paper's recipes say true); "
                          "false: raise it to the next multiple of the world size and scale the learning rate by "
                          "the square root (printed)"},
    )
    resume: bool = field(default=True, metadata={"help": "continue from the last complete checkpoint in output_dir"})
    merge: bool = field(
        default=True, metadata={"help": "also save the adapter merged into the base weights (in float32, main process)"}
    )


def training_defaults() -> dict[str, Any]:
    """The `training:` section a recipe starts from: the fields `HeadstartSFTConfig` declares, at
    its defaults (imported when a recipe is read: TRL is heavy, and train.memory's help needs none)."""
    from train.training_fields import TRAINING_DEFAULTS

    return dict(TRAINING_DEFAULTS)


@dataclass
class RefusionSection:
    slot_sizes: list[int] = field(
        default_factory=lambda: [4, 8, 16, 32],
        metadata={"help": "answer slot sizes in tokens; each example draws one (objective: refusion)"},
    )
    eps: float = field(
        default=1e-3, metadata={"help": "lowest slot-masking probability: p = (1 - eps) t + eps, t ~ U(0, 1); in (0, 1)"}
    )
    clean_average: str = field(
        default="batch",
        metadata={"help": "clean (autoregressive) loss term: batch (upstream: mean over the micro-batch's clean targets) or "
                          "example (headstart's earlier per-example mean, each example weighing the same)"},
    )
    over_long: str = field(
        default="skip",
        metadata={"help": "rows whose prompt + draft + answer exceed training.max_length: skip (upstream: dropped before "
                          "training, the count printed) or cut (cut from the end, losing the answer's end)"},
    )


@dataclass
class DistillSection:
    divergence: str = field(
        default="forward",
        metadata={"help": "forward: KL(teacher || student), mean-covering; reverse: KL(student || teacher), mode-seeking"},
    )
    top_k: int = field(
        default=0,
        metadata={"help": "0: KL over the full vocabulary; k: over the teacher's top-k tokens plus one bucket for the "
                          "rest (a lower bound of the full KL that keeps k + 1 teacher numbers per token)"},
    )


@dataclass
class SdftSection:
    """The SDFTConfig fields of `objective: sdft` worth choosing (train/sdft.py sets the others)."""

    max_completion_length: int = field(
        default=128, metadata={"help": "tokens the student drafts per prompt (its generation cap); the teacher "
                                       "prompt plus this must fit in training.max_length"})
    num_generations: int = field(
        default=1, metadata={"help": "drafts per prompt; the effective batch must be a multiple (1: as many "
                                     "distinct prompts per step as sft and distill see rows)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the drafts (also divides "
                                                              "both models' logits in the loss, as TRL does)"})
    distillation_mode: str = field(
        default="topk_logits",
        metadata={"help": "TRL's loss: topk_logits (over the student's top-k tokens), full_logits (full vocabulary) "
                          "or sampled_token (reverse KL on the drafted tokens; needs distillation_alpha=1)"})
    distillation_topk: int = field(default=100, metadata={"help": "k of topk_logits"})
    distillation_alpha: float = field(
        default=0.5, metadata={"help": "0: KL(teacher || student), 1: KL(student || teacher), between: the "
                                       "generalized Jensen-Shannon divergence (TRL's default 0.5)"})


@dataclass
class WandbSection:
    project: str | None = field(default=None, metadata={"help": "W&B project; unset (and no WANDB_PROJECT) = offline run"})
    entity: str | None = field(default=None, metadata={"help": "W&B entity (team or user)"})
    tags: list[str] = field(default_factory=list, metadata={"help": "extra tags beside recipe, model and git commit"})


@dataclass
class TrainRecipe:
    objective: str = field(default="sft", metadata={"help": f"training objective: {', '.join(OBJECTIVES)}"})
    model: ModelSection = field(default_factory=ModelSection, metadata={"help": "base model"})
    data: DataSection = field(default_factory=DataSection, metadata={"help": "conversational training data"})
    lora: LoraSection = field(default_factory=LoraSection, metadata={"help": "PEFT LoRA adapter"})
    run: RunSection = field(default_factory=RunSection, metadata={"help": "batch plan, resume and merge (headstart's own)"})
    training: dict[str, Any] = field(
        default_factory=training_defaults,
        metadata={"help": "TRL SFTConfig fields under their own names (optimisation, schedule, checkpoints, logging)",
                  "help_rows": "train.sft_config:training_help_rows"},  # headstart.config.render_help
    )
    refusion: RefusionSection = field(default_factory=RefusionSection, metadata={"help": "ReFusion slot objective settings"})
    distill: DistillSection = field(
        default_factory=DistillSection, metadata={"help": "self-distillation from the full request (objective: distill)"}
    )
    sdft: SdftSection = field(
        default_factory=SdftSection,
        metadata={"help": "on-policy self-distillation, TRL's SDFTTrainer (objective: sdft; train/sdft.py)"},
    )
    wandb: WandbSection = field(default_factory=WandbSection, metadata={"help": "Weights & Biases run"})


class RecipeValueError(RecipeError):
    """A recipe whose keys are valid but whose values cannot work together."""
