"""Every recipe under recipes/ parses and validates against its own schema."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from headstart.config import RECIPES_DIR, RecipeError, config_from_dict, load_config
from train.config import RecipeValueError, TrainRecipe, validate
from train.sft import parse_recipe

# recipes/<folder>/ -> the schema of the entry point that reads it (module, class).
SCHEMAS = {
    "train": ("train.config", "TrainRecipe"),
    "data": ("data_builders.config", "BuildConfig"),
    "eval": ("eval.config", "EvalConfig"),
}
ALL_YAML = sorted(RECIPES_DIR.rglob("*.yaml"))
TRAIN_RECIPES = ["smollm2_prefix", "qwen3_prefix", "llama31_prefix", "gemma3_prefix"]


def _schema_for(path: Path):
    folder = path.relative_to(RECIPES_DIR).parts[0]
    if folder not in SCHEMAS:
        return None
    module, name = SCHEMAS[folder]
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None  # another part's schema is not there yet: parsing is all we can check


@pytest.mark.parametrize("path", ALL_YAML, ids=[str(p.relative_to(RECIPES_DIR)) for p in ALL_YAML])
def test_every_recipe_parses_and_validates(path):
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(values, dict), f"{path} is not a mapping"
    if path.parent.name == "accelerate":
        _check_accelerate_config(path)
        return
    schema = _schema_for(path)
    if schema is not None:
        config = config_from_dict(schema, values)
        if schema is TrainRecipe:
            validate(config)


def _check_accelerate_config(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))  # accelerate's own schema: unknown keys raise
    ds_file = (config.deepspeed_config or {}).get("deepspeed_config_file")
    if ds_file:
        ds = json.loads((RECIPES_DIR.parent / ds_file).read_text())
        assert ds["zero_optimization"]["stage"] in (2, 3)
        assert ds["bf16"]["enabled"] == "auto", "precision must follow the recipe (bf16 on GPU, fp32 on CPU)"


@pytest.mark.parametrize("name", TRAIN_RECIPES)
def test_training_recipes_have_the_papers_adapter(name):
    recipe, recipe_name = parse_recipe([f"recipe={name}"])
    assert recipe_name == name and recipe.objective == "sft"
    assert (recipe.lora.r, recipe.lora.alpha, recipe.lora.dropout) == (8, 16, 0.05)
    assert recipe.data.system_message == "incomplete_request"
    if name != "smollm2_prefix":  # the embedded default is cut down to run on CPU in minutes
        t = recipe.training
        assert (t.learning_rate, t.effective_batch_size, t.max_length, t.max_steps) == (2e-5, 16, 2048, 1000)


def test_default_recipe_is_the_embedded_one():
    recipe, name = parse_recipe([])
    assert name == "smollm2_prefix" and recipe.model.name_or_path == "smollm2"


def test_key_typo_fails_listing_valid_keys():
    with pytest.raises(RecipeError) as error:
        load_config(TrainRecipe, ["recipe=smollm2_prefix", "training.learnig_rate=1e-4"])
    message = str(error.value)
    assert "learnig_rate" in message
    assert "learning_rate" in message and "effective_batch_size" in message


def test_typo_in_a_recipe_file_fails_listing_valid_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lora:\n  rank: 8\n")
    with pytest.raises(RecipeError, match=r"unknown key lora\.rank.*valid keys: alpha, dropout, r, target_modules"):
        load_config(TrainRecipe, [f"recipe={bad}"])


def test_unimplemented_objective_is_a_clear_error():
    with pytest.raises(RecipeValueError, match="objective 'dpo' is not implemented; available: sft, refusion, distill"):
        parse_recipe(["objective=dpo"])


def test_effective_batch_must_split_over_processes():
    from train.config import accumulation_steps

    recipe, _ = parse_recipe(["recipe=qwen3_prefix"])
    assert accumulation_steps(recipe, world_size=8) == 1
    assert accumulation_steps(recipe, world_size=1) == 8
    with pytest.raises(RecipeValueError, match="not a multiple"):
        accumulation_steps(recipe, world_size=3)
