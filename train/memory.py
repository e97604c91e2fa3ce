"""Memory per GPU of a training recipe, worked out before any GPU is rented.

    python -m train.memory                          # every paper recipe, `gpus=8`, `card_gib=80`
    python -m train.memory recipe=qwen3_prefix      # one recipe
    python -m train.memory recipe=gemma3_prefix gpus=16 card_gib=141 training.max_length=4096

The architecture comes from the model's `config.json` vendored in `headstart/recipes/models/<hub id>/`
(no download; see headstart/recipes/models/README.md), the adapter and batch from the recipe, read
with the training script's own loader (train/recipe.py `parse_recipe`, train/model.py `lora_config`), and the
per-device batch from the batch plan of that many GPUs (train/batch.py `batch_plan`). Every
figure is a worst case: every sequence of the micro-batch padded to `training.max_length`,
every position an answer token. It is the memory of the tensors PyTorch allocates; the CUDA
context, cuBLAS workspaces and allocator fragmentation come on top, so a recipe "fits" a
card when the estimate stays under `FIT_SHARE` of it.
The formulas, and how they are derived and checked: train/memory_formulas.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from headstart.config import RecipeError, exit_on_help
from headstart.paths import RECIPES_DIR
from train.batch import batch_plan
from train.memory_formulas import (
    Activations,
    Architecture,
    activation_bytes,
    adapter_of,
    lora_state_bytes,
    weight_bytes,
)

MODELS_DIR = RECIPES_DIR / "models"
PAPER_RECIPES = (
    "qwen3_prefix", "llama31_prefix", "gemma3_prefix", "qwen3_distill",
    "refusion_prefix_to_answer", "refusion_draft_refinement",
)
GIB = 1 << 30
FIT_SHARE = 0.9  # of the card: the rest is left to the CUDA context, workspaces and fragmentation


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU of one recipe on one launch shape."""

    recipe: str
    strategy: str  # "ddp" or "zero3"
    gpus: int
    per_device_batch: int
    length: int
    weights: int
    lora_state: int
    activations: Activations
    activations_checkpointed: Activations

    def total(self, checkpointing: bool) -> int:
        """Bytes per GPU: weights, LoRA state and peak activations.

        Args:
            checkpointing (bool): whether activation checkpointing is on.
        """
        acts = self.activations_checkpointed if checkpointing else self.activations
        return self.weights + self.lora_state + acts.peak


def vendored_config(name_or_path: str):
    """The transformers config of a model vendored in headstart/recipes/models/<hub id>/config.json.

    Args:
        name_or_path (str): the model's hub id, as the recipe names it.
    """
    from transformers import AutoConfig

    directory = MODELS_DIR / name_or_path
    if not (directory / "config.json").is_file():
        known = sorted(str(p.parent.relative_to(MODELS_DIR)) for p in MODELS_DIR.rglob("config.json"))
        raise FileNotFoundError(
            f"no vendored config for {name_or_path!r} in {MODELS_DIR}; vendored: {', '.join(known)}"
        )
    return AutoConfig.from_pretrained(directory)


def estimate(recipe, recipe_name: str, strategy: str, gpus: int) -> Estimate:
    """The memory of `recipe` per GPU when launched on `gpus` GPUs with `strategy` (ddp, zero3).

    Args:
        recipe (TrainRecipe): the training recipe.
        recipe_name (str): the recipe's name, for the table.
        strategy (str): "ddp" or "zero3".
        gpus (int): the number of GPUs launched.
    """
    if not recipe.model.use_peft:
        raise RecipeError("model.use_peft=false: the estimate covers LoRA training (weights frozen, adapter states)")
    if recipe.model.dtype not in (None, "bfloat16"):
        raise RecipeError(
            f"model.dtype {recipe.model.dtype}: the estimate covers bf16 training (dtype unset or bfloat16)"
        )
    arch = Architecture.from_config(vendored_config(recipe.model.name_or_path))
    adapter = adapter_of(recipe, arch)
    batch, length = batch_plan(recipe, gpus).per_device, recipe.training["max_length"]
    args = {"batch": batch, "length": length, "objective": recipe.objective, "top_k": recipe.distill.top_k,
                "adapter_dtype_bytes": 4 if strategy == "ddp" else 2}
    return Estimate(
        recipe=recipe_name, strategy=strategy, gpus=gpus, per_device_batch=batch, length=length,
        weights=weight_bytes(arch, strategy, gpus), lora_state=lora_state_bytes(adapter.params(arch), strategy, gpus),
        activations=activation_bytes(arch, adapter, checkpointing=False, **args),
        activations_checkpointed=activation_bytes(arch, adapter, checkpointing=True, **args),
    )


@dataclass
class MemoryArgs:
    """Memory per GPU of the paper recipes (or the `recipe=` ones) under DDP and ZeRO-3."""

    gpus: int = field(default=8, metadata={"help": "GPUs the run is launched on (the world size of the batch plan)"})
    card_gib: float = field(default=80.0, metadata={"help": "memory of one card in GiB; a fit leaves 10% of it free"})
    overrides: list[str] = field(
        default_factory=list,
        metadata={"help": "every other key=value: an override of each recipe (training.max_length=4096); "
                          "see train/sft.py --help"},
    )


def parse_args(argv: list[str]) -> tuple[list[str], MemoryArgs]:
    """The recipe names (every paper recipe when none is given) and the tool's own settings;
    any other key=value overrides the recipe (training.max_length=4096).

    Args:
        argv (list[str]): the command line: `recipe=NAME` (repeatable), `gpus=N`, `card_gib=GIB`, overrides.
    """
    args, names = MemoryArgs(), []
    for arg in argv:
        key, _, value = arg.partition("=")
        if not value:
            raise RecipeError(f"argument {arg!r} is not of the form key=value")
        if key == "recipe":
            names.append(value)
        elif key in ("gpus", "card_gib"):
            try:
                setattr(args, key, (int if key == "gpus" else float)(value))
            except ValueError:
                raise RecipeError(f"{key}={value!r} is not a number") from None
        else:
            args.overrides.append(arg)
    if args.gpus < 1:
        raise RecipeError(f"gpus must be >= 1, got {args.gpus}")
    return names or list(PAPER_RECIPES), args


def table(estimates: list[Estimate], card_gib: float) -> str:
    """The estimates as a Markdown table, with whether each fits `FIT_SHARE` of the card.

    Args:
        estimates (list[Estimate]): the estimates, one row each.
        card_gib (float): the card's memory in GiB.
    """
    budget = FIT_SHARE * card_gib
    header = (f"| recipe | launch | batch x length | weights | LoRA state | activations (no ckpt / ckpt) "
              f"| total, no ckpt | total, ckpt | fits {card_gib:g} GiB? (no ckpt / ckpt) |")
    lines = [header, "|" + "---|" * 9]
    for e in estimates:
        launch = "DDP" if e.strategy == "ddp" else f"ZeRO-3 / {e.gpus}"
        no_ckpt, ckpt = e.total(False) / GIB, e.total(True) / GIB
        fits = " / ".join("yes" if total <= budget else "no" for total in (no_ckpt, ckpt))
        activations = f"{e.activations.peak / GIB:.1f} / {e.activations_checkpointed.peak / GIB:.1f}"
        lines.append(
            f"| {e.recipe} | {launch} | {e.per_device_batch} x {e.length} | {e.weights / GIB:.1f} | "
            f"{e.lora_state / GIB:.2f} | {activations} | {no_ckpt:.1f} | {ckpt:.1f} | {fits} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    """Print the table of the named recipes (every paper recipe by default).

    Args:
        argv (list[str]): the command line (see `parse_args`).
    """
    exit_on_help(MemoryArgs, argv, usage="[recipe=NAME ...] [gpus=N] [card_gib=GIB] [section.key=value ...]")
    from train.recipe import parse_recipe

    names, args = parse_args(argv)
    estimates = []
    for name in names:
        recipe, recipe_name = parse_recipe([f"recipe={name}", *args.overrides])
        estimates += [estimate(recipe, recipe_name, strategy, args.gpus) for strategy in ("ddp", "zero3")]
    print(f"GiB per GPU, {args.gpus} GPUs (per-device batch from the recipe's batch plan), worst case: every sequence "
          f"at max_length, every position an answer token. Fits = under {FIT_SHARE:.0%} of the card "
          f"(the rest: CUDA context, workspaces, fragmentation). Formulas: train/memory_formulas.py.")
    print(table(estimates, args.card_gib))


if __name__ == "__main__":
    from headstart.config import cli_main

    sys.exit(cli_main(lambda: main(sys.argv[1:])))
