"""The training recipe schema: what `recipes/train/*.yaml` may say.

One dataclass per section, each field with a one-line help, in TRL's style. The
loader (`headstart.config.load_config`) rejects keys that are not declared here.
The defaults are the embedded CPU default (`smollm2_prefix`), so a bare
`train/sft.py` run trains SmolLM2-135M in minutes without network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from headstart.prompts import canonical_system_setting

OBJECTIVES = ("sft", "refusion", "distill")
# The trackers train/sft.py configures (train/tracking.py); none: no tracker.
TRACKERS = ("tensorboard", "wandb", "none")
DIVERGENCES = ("forward", "reverse")


@dataclass
class ModelSection:
    name_or_path: str = field(
        default="smollm2", metadata={"help": "base model: embedded name (smollm2), hub id, local dir or .gguf file"}
    )
    dtype: str = field(default="auto", metadata={"help": "weights dtype: auto (bf16 on GPU, fp32 on CPU), float32, bfloat16"})
    attn_implementation: str = field(default="sdpa", metadata={"help": "attention kernel passed to from_pretrained"})


@dataclass
class DataSection:
    path: str = field(
        default="outputs/data/embedded_prefix",
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
class TrainingSection:
    output_dir: str | None = field(default=None, metadata={"help": "run directory; default outputs/train/<recipe>"})
    learning_rate: float = field(default=2e-4, metadata={"help": "peak learning rate"})
    effective_batch_size: int = field(
        default=4, metadata={"help": "sequences per optimizer step = world size x per-device batch x accumulation"}
    )
    per_device_train_batch_size: int = field(
        default=2, metadata={"help": "sequences per process per micro-step (at most: lowered to keep the effective batch)"}
    )
    keep_effective_batch: bool = field(
        default=False,
        metadata={"help": "refuse a world size that cannot keep effective_batch_size (the paper's recipes say true); "
                          "false: raise it to the next multiple of the world size and scale the learning rate by "
                          "the square root (printed)"},
    )
    ddp_timeout: int = field(
        default=1800, metadata={"help": "seconds a collective (barrier, all-reduce) waits for the other processes"}
    )
    max_length: int = field(default=512, metadata={"help": "tokens per sequence (longer ones are truncated)"})
    max_steps: int = field(default=20, metadata={"help": "optimizer steps"})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers scheduler name"})
    warmup_ratio: float = field(default=0.03, metadata={"help": "share of steps spent warming up"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    seed: int = field(default=42, metadata={"help": "seed for initialisation, dropout and data order"})
    bf16: bool | None = field(
        default=None, metadata={"help": "bf16 mixed precision; null = on with CUDA, off on CPU; true asks for a GPU "
                                        "(refused where CUDA is unusable, unless accelerate launch --cpu)"}
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations to save memory"})
    packing: bool = field(default=False, metadata={"help": "pack sequences (bfd, padding-free) instead of padding"})
    padding_free: bool = field(default=False, metadata={"help": "flatten each batch without pad tokens"})
    logging_steps: int = field(default=1, metadata={"help": "log every N optimizer steps"})
    save_steps: int = field(default=10, metadata={"help": "checkpoint every N optimizer steps"})
    save_total_limit: int | None = field(default=2, metadata={"help": "checkpoints kept on disk"})
    eval_steps: int = field(default=0, metadata={"help": "evaluate every N steps; 0 = never during training"})
    report_to: list[str] = field(
        default_factory=lambda: ["tensorboard", "wandb"], metadata={"help": "trackers: tensorboard, wandb, none"}
    )
    run_name: str | None = field(default=None, metadata={"help": "tracker run name; default <recipe>-<model>"})
    resume: bool = field(default=True, metadata={"help": "continue from the last complete checkpoint in output_dir"})
    merge: bool = field(
        default=True, metadata={"help": "also save the adapter merged into the base weights (in float32, main process)"}
    )
    dataloader_num_workers: int = field(default=0, metadata={"help": "data loader worker processes"})


@dataclass
class RefusionSection:
    slot_sizes: list[int] = field(
        default_factory=lambda: [4, 8, 16, 32],
        metadata={"help": "answer slot sizes in tokens; each example draws one (objective: refusion)"},
    )
    eps: float = field(
        default=1e-3, metadata={"help": "lowest slot-masking probability: p = (1 - eps) t + eps, t ~ U(0, 1); in (0, 1)"}
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
    training: TrainingSection = field(default_factory=TrainingSection, metadata={"help": "optimisation and checkpoints"})
    refusion: RefusionSection = field(default_factory=RefusionSection, metadata={"help": "ReFusion slot objective settings"})
    distill: DistillSection = field(
        default_factory=DistillSection, metadata={"help": "self-distillation from the full request (objective: distill)"}
    )
    wandb: WandbSection = field(default_factory=WandbSection, metadata={"help": "Weights & Biases run"})


class RecipeValueError(ValueError):
    """A recipe whose keys are valid but whose values cannot work together."""


# The keys a run may change when it resumes in its run directory: when it stops, how
# often it saves, evaluates and logs, where it reports, and what is done after training.
# Every other key decides what the steps compute (data, model, LoRA, optimiser,
# schedule, batch, seed, objective): a relaunch that changes one is refused
# (train/checkpoints.py: check_run_dir), since the trainer would silently continue the
# saved run (a changed learning rate resumes with the saved one; a finished run runs
# 0 steps). Changing max_steps extends or shortens the run, and the remaining steps
# follow the learning-rate schedule of the new max_steps (cosine and warm-up are
# shares of it), so the result is not what a fresh run of that length gives; the
# run says so when it resumes.
RESUMABLE_KEYS = (
    "training.max_steps",
    "training.save_steps",
    "training.save_total_limit",
    "training.eval_steps",
    "training.logging_steps",
    "training.report_to",
    "training.run_name",
    "training.output_dir",
    "training.resume",
    "training.merge",
    "training.ddp_timeout",
    "training.dataloader_num_workers",  # the sampler and its order stay in the main process
    # Only refuses or allows a raised batch; check_resume compares the plan itself with the checkpoint's.
    "training.keep_effective_batch",
    "wandb.project",
    "wandb.entity",
    "wandb.tags",
)


def recipe_differences(saved: TrainRecipe, recipe: TrainRecipe) -> dict[str, tuple[Any, Any]]:
    """Keys whose values differ between two recipes, `RESUMABLE_KEYS` aside: {key: (saved, new)}."""
    from headstart.config import config_to_dict

    old, new = canonical_keys(config_to_dict(saved)), canonical_keys(config_to_dict(recipe))
    return {key: (old.get(key), new.get(key)) for key in sorted(old.keys() | new.keys())
            if key not in RESUMABLE_KEYS and old.get(key) != new.get(key)}


def canonical_keys(values: dict[str, Any]) -> dict[str, Any]:
    """`flat_keys`, with the system message setting in its canonical spelling (a run saved
    with the old `incomplete_request` is the same recipe as one saying `incomplete`)."""
    flat = flat_keys(values)
    if isinstance(flat.get("data.system_message"), str):
        flat["data.system_message"] = canonical_system_setting(flat["data.system_message"])
    return flat


def flat_keys(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= flat_keys(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def validate(recipe: TrainRecipe) -> TrainRecipe:
    """Reject values the schema's types cannot: unknown objective, bad batch split, bad slot settings."""
    if recipe.objective not in OBJECTIVES:
        raise RecipeValueError(
            f"objective {recipe.objective!r} is not implemented; available: {', '.join(OBJECTIVES)}"
        )
    t = recipe.training
    for name in ("effective_batch_size", "per_device_train_batch_size", "max_length", "max_steps", "save_steps"):
        if getattr(t, name) < 1:
            raise RecipeValueError(f"training.{name} must be >= 1, got {getattr(t, name)}")
    if t.ddp_timeout < 1:
        raise RecipeValueError(f"training.ddp_timeout must be >= 1 second, got {t.ddp_timeout}")
    if recipe.model.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise RecipeValueError(f"model.dtype {recipe.model.dtype!r}: use auto, float32, bfloat16 or float16")
    validate_numbers(recipe)
    try:
        recipe.data.system_message = canonical_system_setting(recipe.data.system_message)
    except ValueError as error:
        raise RecipeValueError(f"data.system_message: {error}") from error
    validate_refusion(recipe)
    validate_distill(recipe)
    return recipe


def validate_numbers(recipe: TrainRecipe) -> None:
    """Values PEFT, TRL or the optimiser would refuse (or misuse) only once the model has
    loaded: a rank-0 adapter, a negative learning rate, a tracker name nobody knows."""
    lora, t = recipe.lora, recipe.training
    if lora.r < 1:
        raise RecipeValueError(f"lora.r must be >= 1 (the adapter's rank), got {lora.r}")
    if lora.alpha <= 0:
        raise RecipeValueError(f"lora.alpha must be > 0 (scale = alpha / r), got {lora.alpha}")
    if not 0 <= lora.dropout < 1:
        raise RecipeValueError(f"lora.dropout must be in [0, 1), got {lora.dropout}")
    if not lora.target_modules and not lora.target_regex:
        raise RecipeValueError("lora.target_modules is empty and lora.target_regex unset: no module would get an adapter")
    if not (math.isfinite(t.learning_rate) and t.learning_rate > 0):
        raise RecipeValueError(f"training.learning_rate must be a positive number, got {t.learning_rate}")
    if not 0 <= t.warmup_ratio <= 1:
        raise RecipeValueError(f"training.warmup_ratio must be in [0, 1] (a share of the steps), got {t.warmup_ratio}")
    for name in ("weight_decay", "eval_steps", "dataloader_num_workers"):
        if getattr(t, name) < 0:
            raise RecipeValueError(f"training.{name} must be >= 0, got {getattr(t, name)}")
    if t.max_grad_norm < 0:
        raise RecipeValueError(f"training.max_grad_norm must be >= 0 (0: no clipping), got {t.max_grad_norm}")
    if t.logging_steps < 1:
        raise RecipeValueError(f"training.logging_steps must be >= 1, got {t.logging_steps}")
    if t.save_total_limit is not None and t.save_total_limit < 1:
        raise RecipeValueError(f"training.save_total_limit must be null (keep all) or >= 1, got {t.save_total_limit}")
    unknown = [name for name in t.report_to if name not in TRACKERS]
    if unknown:
        raise RecipeValueError(f"training.report_to: unknown tracker {', '.join(map(repr, unknown))}; "
                               f"use a list of {', '.join(TRACKERS)}")
    for name in ("max_train_samples", "max_eval_samples"):
        if getattr(recipe.data, name) is not None and getattr(recipe.data, name) < 1:
            raise RecipeValueError(f"data.{name} must be null (all rows) or >= 1, got {getattr(recipe.data, name)}")


def validate_refusion(recipe: TrainRecipe) -> None:
    """Slot sizes and eps are checked whatever the objective (the defaults pass). The layout
    needs its own collator, which TRL's packing and padding-free modes would replace, run
    in the main process, where it counts the batches it lays out."""
    r = recipe.refusion
    if not r.slot_sizes or any(size < 1 for size in r.slot_sizes):
        raise RecipeValueError(f"refusion.slot_sizes must be a non-empty list of sizes >= 1, got {list(r.slot_sizes)}")
    if not 0 < r.eps < 1:
        raise RecipeValueError(f"refusion.eps must be in (0, 1), got {r.eps}")
    if recipe.objective != "refusion":
        return
    if recipe.training.packing or recipe.training.padding_free:
        raise RecipeValueError(
            "objective: refusion lays out and pads its own batches; set training.packing and training.padding_free to false"
        )
    if recipe.training.dataloader_num_workers:
        raise RecipeValueError(
            "objective: refusion numbers its batches in the main process to draw their layouts; "
            "set training.dataloader_num_workers to 0"
        )


def validate_distill(recipe: TrainRecipe) -> None:
    """Divergence and top-k are checked whatever the objective (the defaults pass). The
    student and teacher sequences are laid out by their own collator, which TRL's packing
    and padding-free modes would replace."""
    d = recipe.distill
    if d.divergence not in DIVERGENCES:
        raise RecipeValueError(f"distill.divergence {d.divergence!r}: use {' or '.join(DIVERGENCES)}")
    if d.top_k < 0:
        raise RecipeValueError(f"distill.top_k must be >= 0 (0 = the full vocabulary), got {d.top_k}")
    if recipe.objective == "distill" and (recipe.training.packing or recipe.training.padding_free):
        raise RecipeValueError(
            "objective: distill pads its student and teacher batches itself; set training.packing and "
            "training.padding_free to false"
        )


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step is split over the processes of this launch.

    world_size x per_device x accumulation = effective. The recipe's effective batch is
    kept whenever the world size divides it, lowering the per-device batch as far as
    needed (16 over 16 processes: 1 x 1). A world size that cannot keep it (16 over 3,
    24 or 32 processes) raises it to the next multiple of the world size, and the
    learning rate is scaled by the square root of the ratio (the square-root rule for
    Adam-type optimisers), unless `training.keep_effective_batch` asks for a refusal."""

    world_size: int
    per_device: int
    accumulation: int
    effective: int
    learning_rate: float
    requested_per_device: int
    requested_effective: int
    requested_learning_rate: float

    @property
    def kept(self) -> bool:
        return self.effective == self.requested_effective

    def notes(self) -> list[str]:
        """What differs from the recipe, in words (printed loudly by train/sft.py)."""
        lines = []
        if not self.kept:
            lines.append(
                f"WARNING: effective batch {self.requested_effective} is not a multiple of the world size "
                f"{self.world_size}; raised to {self.effective} (= {self.world_size} processes x {self.per_device} "
                f"per device x {self.accumulation} accumulation) and the learning rate scaled by "
                f"sqrt({self.effective}/{self.requested_effective}): {self.requested_learning_rate:g} -> "
                f"{self.learning_rate:.4g}. Launch on a world size dividing {self.requested_effective} to keep the "
                f"recipe, or set training.keep_effective_batch=true to refuse instead"
            )
        if self.per_device != self.requested_per_device:
            lines.append(
                f"note: per-device batch lowered {self.requested_per_device} -> {self.per_device} so that "
                f"{self.world_size} processes make the effective batch {self.effective}"
            )
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "per_device_train_batch_size": self.per_device,
                "gradient_accumulation_steps": self.accumulation, "effective_batch_size": self.effective,
                "learning_rate": self.learning_rate}


def batch_plan(training: TrainingSection, world_size: int) -> BatchPlan:
    """The split of `training.effective_batch_size` over `world_size` processes (see BatchPlan)."""
    effective, most, rate = training.effective_batch_size, training.per_device_train_batch_size, training.learning_rate
    if world_size < 1:
        raise RecipeValueError(f"world size must be >= 1, got {world_size}")
    requested = dict(requested_per_device=most, requested_effective=effective, requested_learning_rate=rate)
    for per_device in range(most, 0, -1):
        if effective % (world_size * per_device) == 0:
            return BatchPlan(world_size, per_device, effective // (world_size * per_device), effective, rate, **requested)
    raised = -(-effective // world_size) * world_size
    if training.keep_effective_batch:
        raise RecipeValueError(
            f"training.effective_batch_size={effective} cannot be split over {world_size} processes (it is not a "
            f"multiple of {world_size}) and training.keep_effective_batch is true: launch on a world size that "
            f"divides {effective} (e.g. {largest_divisor(effective, world_size)} processes), or pass "
            f"training.keep_effective_batch=false to accept the raised batch {raised} (learning rate "
            f"{rate:g} x sqrt({raised}/{effective}) = {rate * math.sqrt(raised / effective):.4g})"
        )
    per_process = raised // world_size
    per_device = max(d for d in range(1, most + 1) if per_process % d == 0)
    return BatchPlan(world_size, per_device, per_process // per_device, raised, rate * math.sqrt(raised / effective),
                     **requested)


def largest_divisor(effective: int, below: int) -> int:
    """The largest world size under `below` that keeps `effective` (1 keeps any)."""
    return max(size for size in range(1, below) if effective % size == 0)
