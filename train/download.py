"""Fetch what a training recipe loads from the hub, before it runs where there is no internet:

    python -m train.download recipe=qwen3_prefix                  # Qwen/Qwen3-8B into the hub cache
    python -m train.download recipe=llama31_prefix model.name_or_path=meta-llama/Llama-3.1-8B-Instruct
    HF_HUB_OFFLINE=1 python -m train.download recipe=qwen3_prefix  # only checks the cache

Run it once on a machine with internet access and the same `HF_HOME` (the cache
the compute nodes read), then train with `HF_HUB_OFFLINE=1`: every rank loads from
the cache, and W&B writes offline runs (`wandb sync` them later). The model's
configs, tokenizer and safetensors weights are fetched (headstart.models.download_model),
and the training data too when `data.path` is a hub dataset id. Embedded names,
.gguf files and local directories need nothing.
"""

from __future__ import annotations

import sys

from headstart.config import cli_main
from headstart.models import download_model, is_hub_id
from headstart.paths import is_default_output
from train.data import load_split
from train.recipe import parse_recipe


def run(argv: list[str]) -> dict[str, str | None]:
    """Fetch the recipe's model, and its data when it is a hub dataset; returns what was fetched.

    Args:
        argv (list[str]): `recipe=NAME` and `key=value` overrides, as train/sft.py takes them.
    """
    recipe, name = parse_recipe(argv)
    fetched = {"model": download_model(recipe.model.name_or_path)}
    print(f"{name}: model {recipe.model.name_or_path}: "
          + (f"in the hub cache at {fetched['model']}" if fetched["model"] else "local, nothing to fetch"), flush=True)
    if is_hub_id(recipe.data.path) and not is_default_output(recipe.data.path):
        for split in filter(None, (recipe.data.train_split, recipe.data.eval_split)):
            load_split(recipe.data.path, split)  # `datasets` caches it under HF_HOME
        fetched["data"] = recipe.data.path
        print(f"{name}: data {recipe.data.path}: in the datasets cache", flush=True)
    return fetched


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): the command line; None: `sys.argv[1:]`.
    """
    return cli_main(lambda: run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
