"""The `training:` section's declaration: TRL's `SFTConfig` with headstart's defaults.

A recipe's `training:` keys are `SFTConfig`'s field names (as alignment-handbook's recipes give
them). `HeadstartSFTConfig` declares the fields headstart sets its own way, with their defaults
and help, as TRL's `SFTConfig` does over `TrainingArguments`; those fields are what `--help`
lists and what a recipe's section starts from. Imports TRL and nothing of train/, so the recipe
schema (train/config.py) can read its defaults without a cycle.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from typing import Any

from transformers.trainer_utils import SaveStrategy, SchedulerType
from trl import SFTConfig

TRL_FIELDS = {f.name: f for f in dataclasses.fields(SFTConfig)}


def _headstart(default: Any = None, note: str = "", *, factory: Any = None) -> Any:
    """A field headstart sets its own way; `note`: what headstart does beyond TRL's meaning."""
    kind = {"default_factory": factory} if factory is not None else {"default": default}
    return dataclasses.field(**kind, metadata={"headstart": note})


def _with_trl_help(cls: type) -> type:
    """Give each field `cls` declares TRL's help, then its headstart note, as its `help` metadata
    (what HfArgumentParser and `--help` read)."""
    for name in cls.__annotations__:
        f, note = cls.__dataclass_fields__[name], cls.__dataclass_fields__[name].metadata["headstart"]
        text = TRL_FIELDS[name].metadata.get("help", "") + (f" headstart: {note}." if note else "")
        f.metadata = types.MappingProxyType({"help": text})  # argparse's keywords only
    return cls


@_with_trl_help
@dataclass
class HeadstartSFTConfig(SFTConfig):
    r"""TRL's [`SFTConfig`] with the defaults of headstart's embedded CPU recipe (`smollm2_prefix`): a bare
    `train/sft.py` run trains SmolLM2-135M in minutes without network. A field's help is TRL's, then
    what headstart does beyond it (`training_help_rows`).

    > [!NOTE]
    > These parameters have default values different from [`SFTConfig`]:
    > - `learning_rate` `2e-4` (not `2e-5`), `per_device_train_batch_size` `2` (not `8`), `max_length` `512`
    >   (not `1024`), `max_steps` `20` (not `-1`), `lr_scheduler_type` `"cosine"` (not `"linear"`),
    >   `warmup_steps` `0.03` (not `0`), `logging_steps` `1` (not `10`), `save_steps` `10` (not `500`),
    >   `save_total_limit` `2` (not `None`), `eval_steps` `0` (never; not `None`).
    > - `bf16` `None`: on with CUDA, off on CPU (not on unless `fp16`); `activation_checkpointing` `False`
    >   (not on); `completion_only_loss` `True` (the answer only).
    > - `report_to` `["tensorboard", "wandb"]` (not `"none"`); `include_num_input_tokens_seen` `"all"` (not `"no"`).
    """

    output_dir: str | None = _headstart(None, "null: outputs/train/<recipe>")
    run_name: str | None = _headstart(None, "null: <recipe>-<model name>")
    learning_rate: float = _headstart(2e-4, "scaled by the square root when the batch plan raises the effective batch")
    per_device_train_batch_size: int = _headstart(2, "at most: lowered to keep run.effective_batch_size")
    max_length: int | None = _headstart(512)
    max_steps: int = _headstart(20)
    lr_scheduler_type: SchedulerType | str = _headstart("cosine")
    warmup_steps: float = _headstart(0.03)
    weight_decay: float = _headstart(0.0)
    max_grad_norm: float = _headstart(1.0)
    seed: int = _headstart(42, "also the data order (data_seed) unless given")
    bf16: bool | None = _headstart(None, "null: on with CUDA, off on CPU; true asks for a GPU (refused where CUDA is "
                                         "unusable, unless accelerate launch --cpu)")
    activation_checkpointing: bool | None = _headstart(False)
    packing: bool = _headstart(False)
    packing_strategy: str = _headstart("bfd")
    padding_free: bool = _headstart(False)
    completion_only_loss: bool | None = _headstart(True)
    logging_steps: float = _headstart(1)
    save_strategy: SaveStrategy | str = _headstart("steps")
    save_steps: float = _headstart(10)
    save_total_limit: int | None = _headstart(2)
    eval_steps: float | None = _headstart(0, "0: never; else every N steps when data.eval_split exists")
    report_to: None | str | list[str] = _headstart(
        note="trackers train/tracking.py configures: tensorboard, wandb, or [none]",
        factory=lambda: ["tensorboard", "wandb"])
    include_num_input_tokens_seen: str | bool = _headstart("all")
    ddp_timeout: int = _headstart(1800, "also the timeout of the process group train/sft.py creates")
    dataloader_num_workers: int = _headstart(0)


# The fields HeadstartSFTConfig declares: the `training:` keys --help lists, and the section's defaults.
# In the order it declares them (dataclasses keep an overridden field at its base class's place).
HEADSTART_FIELDS = [HeadstartSFTConfig.__dataclass_fields__[name] for name in HeadstartSFTConfig.__annotations__]
TRAINING_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default for f in HEADSTART_FIELDS}
