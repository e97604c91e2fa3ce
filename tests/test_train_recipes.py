"""Every recipe under headstart/recipes/ parses and validates against its own schema."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from headstart.config import RecipeError, config_from_dict, load_config
from headstart.paths import RECIPES_DIR
from train.batch import batch_plan
from train.config import RecipeValueError, TrainRecipe
from train.recipe import validate
from train.sft import parse_recipe

REPO = Path(__file__).resolve().parents[1]  # accelerate reads the DeepSpeed file from the checkout's root

# headstart/recipes/<folder>/ -> the schema of the entry point that reads it (module, class).
SCHEMAS = {
    "train": ("train.config", "TrainRecipe"),
    "data": ("data_builders.config", "BuildConfig"),
    "eval": ("eval.evaluation.config", "EvalConfig"),
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
        ds = json.loads((REPO / ds_file).read_text())
        assert ds["zero_optimization"]["stage"] in (2, 3)
        assert ds["bf16"]["enabled"] == "auto", "precision must follow the recipe (bf16 on GPU, fp32 on CPU)"


@pytest.mark.parametrize("name", TRAIN_RECIPES)
def test_training_recipes_have_the_papers_adapter(name):
    recipe, recipe_name = parse_recipe([f"recipe={name}"])
    assert recipe_name == name and recipe.objective == "sft"
    assert (recipe.lora.r, recipe.lora.alpha, recipe.lora.dropout) == (8, 16, 0.05)
    assert recipe.data.system_message == "incomplete"
    if name != "smollm2_prefix":  # the embedded default is cut down to run on CPU in minutes
        t = recipe.training
        assert (t["learning_rate"], recipe.run.effective_batch_size, t["max_length"], t["max_steps"]) == (2e-5, 16, 2048, 1000)


def test_default_recipe_is_the_embedded_one():
    recipe, name = parse_recipe([])
    assert name == "smollm2_prefix" and recipe.model.name_or_path == "smollm2"


def test_key_typo_fails_naming_the_closest_valid_keys():
    with pytest.raises(RecipeError) as error:
        parse_recipe(["recipe=smollm2_prefix", "training.learnig_rate=1e-4"])
    assert str(error.value) == ("unknown key training.learnig_rate (not a field of TRL's SFTConfig); "
                                "closest: learning_rate")
    with pytest.raises(RecipeError, match=r"unknown key run\.effective_batch.*valid keys: effective_batch_size"):
        parse_recipe(["run.effective_batch=4"])


def test_a_key_that_moved_out_of_training_names_its_new_place(tmp_path):
    """Keys headstart itself reads moved from `training:` into `run:` (commit ffcb0a4); the error
    used to offer TRL's closest fields (per_device_train_batch_size for effective_batch_size)."""
    for key, value in (("effective_batch_size", "8"), ("keep_effective_batch", "true"), ("resume", "false"),
                       ("merge", "false")):
        with pytest.raises(RecipeError) as error:
            parse_recipe(["recipe=smollm2_prefix", f"training.{key}={value}"])
        assert str(error.value) == f"training.{key} moved to run.{key}: give run.{key}={value}"
    with pytest.raises(RecipeError, match=r"^training\.warmup_ratio is gone from transformers 5: give "
                                          r"training\.warmup_steps a share below 1 \(0\.03: 3% of the steps\)$"):
        parse_recipe(["training.warmup_ratio=0.03"])
    recipe = tmp_path / "old.yaml"  # a recipe file written before the move says the same
    recipe.write_text("training:\n  learning_rate: 1.0e-4\n  effective_batch_size: 16\n")
    with pytest.raises(RecipeError, match=r"^training\.effective_batch_size moved to run\.effective_batch_size"):
        parse_recipe([f"recipe={recipe}"])


def test_training_section_is_trls_sft_config():
    """Any SFTConfig field is given under its own name and reaches SFTConfig as it is; a bad
    type is refused naming the field; what train/sft.py derives is refused with where it comes from."""
    from train.sft_config import trainer_config

    recipe, _ = parse_recipe(["training.logging_first_step=true", "training.optim=adafactor"])
    args = trainer_config(recipe, "smollm2_prefix", Path("/tmp/unused"), world_size=1, evaluate=False, placement=(0, "cpu"))
    assert args.logging_first_step is True and args.optim == "adafactor"
    assert (args.max_steps, args.learning_rate, args.lr_scheduler_type) == (20, 2e-4, "cosine")
    with pytest.raises(RecipeValueError, match=r"^training\.max_steps must be int, got 'many'$"):
        parse_recipe(["training.max_steps=many"])
    with pytest.raises(RecipeValueError, match="training.gradient_accumulation_steps is set by train/sft.py from "
                                               "run.effective_batch_size"):
        parse_recipe(["training.gradient_accumulation_steps=4"])
    with pytest.raises(RecipeValueError, match="use training.activation_checkpointing"):
        parse_recipe(["training.gradient_checkpointing=true"])
    bad, _ = parse_recipe(["training.lr_scheduler_type=cosin"])  # TRL's own check, in one line
    with pytest.raises(RecipeValueError, match=r"^training: TRL's SFTConfig refuses it: cosin is not a valid SchedulerType"):
        trainer_config(bad, "smollm2_prefix", Path("/tmp/unused"), world_size=1, evaluate=False, placement=(0, "cpu"))


def test_trls_config_is_built_once_from_the_recipe_in_two_steps():
    """train/sft.py builds TRL's config once (before any download), and nothing else in train/ builds
    one: recipe -> `parse_recipe` -> `trainer_config` -> SFTConfig/SDFTConfig."""
    import ast

    def calls(path: Path, names: set[str]) -> list[str]:
        tree = ast.parse(path.read_text())
        return [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) and node.func.id in names]

    assert calls(REPO / "train" / "sft.py", {"trainer_config", "parse_recipe"}) == ["parse_recipe", "trainer_config"]
    builders = {"HeadstartSFTConfig", "SDFTConfig", "SFTConfig", "config_class"}
    built = {path.name: found for path in sorted((REPO / "train").glob("*.py")) if (found := calls(path, builders))}
    assert built == {"sft_config.py": ["config_class"]}


def test_evaluation_is_decided_from_the_datas_split_listing(tmp_path):
    """Whether a run evaluates is known before the data is read: a file holds `train` alone, a saved
    dataset its listed splits; eval_steps 0 or no eval_split never evaluates."""
    from datasets import Dataset, DatasetDict

    from train.splits import evaluates

    rows = Dataset.from_list([{"query": "a", "response": "b"}])
    DatasetDict({"train": rows, "validation": rows}).save_to_disk(str(tmp_path / "both"))
    rows.save_to_disk(str(tmp_path / "bare"))
    (tmp_path / "rows.jsonl").write_text('{"query": "a", "response": "b"}\n')
    decided = [evaluates(parse_recipe([f"data.path={tmp_path / name}", *extra])[0])
               for name, extra in [("both", ["training.eval_steps=5"]), ("bare", ["training.eval_steps=5"]),
                                   ("rows.jsonl", ["training.eval_steps=5"]), ("both", ["training.eval_steps=0"]),
                                   ("both", ["training.eval_steps=5", "data.eval_split=null"])]]
    assert decided == [True, False, False, False, False]


def test_training_help_rows_come_from_sft_configs_metadata():
    from train.sft_config import training_help_rows
    from train.training_fields import TRAINING_DEFAULTS

    rows = {name: (kind, default, text) for name, kind, default, text in training_help_rows()}
    assert set(rows) == set(TRAINING_DEFAULTS)
    assert rows["learning_rate"] == ("float", 2e-4, "The initial learning rate for AdamW. headstart: scaled by the "
                                     "square root when the batch plan raises the effective batch.")
    assert rows["max_length"] == ("int | null", 512, rows["max_length"][2])  # TRL's own help, no note
    assert "%%" not in rows["activation_checkpointing"][2]  # argparse's escape undone


def test_typo_in_a_recipe_file_fails_listing_valid_keys(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("lora:\n  rank: 8\n")
    with pytest.raises(RecipeError, match=r"unknown key lora\.rank.*valid keys: alpha, dropout, r, target_modules"):
        load_config(TrainRecipe, [f"recipe={bad}"])


def test_unimplemented_objective_is_a_clear_error():
    with pytest.raises(RecipeValueError, match="objective 'dpo' is not implemented; available: sft, refusion, distill"):
        parse_recipe(["objective=dpo"])


PAPER = {"effective": 16, "per_device": 2, "lr": 2e-5}


@pytest.mark.parametrize("effective,per_device", [(16, 2), (4, 2), (1, 1), (16, 4), (12, 3)])
def test_batch_plan_for_every_world_size_from_1_to_64(effective, per_device):
    """The paper's effective batch 16 at per-device 2 used to stop every world size but 1, 2, 4
    and 8 (slurm/train.sbatch's 2 x 8 = 16 and the README's 4 x 8 = 32 among them)."""
    recipe, _ = parse_recipe(["recipe=qwen3_prefix", f"run.effective_batch_size={effective}",
                              f"training.per_device_train_batch_size={per_device}",
                              "run.keep_effective_batch=false"])
    lr = recipe.training["learning_rate"]
    for world in range(1, 65):
        plan = batch_plan(recipe, world)
        assert plan.world_size * plan.per_device * plan.accumulation == plan.effective, world
        assert 1 <= plan.per_device <= per_device and plan.accumulation >= 1
        if effective % world == 0:  # kept: the largest per-device batch that divides it
            assert plan.effective == effective and plan.learning_rate == lr and plan.kept
            assert plan.per_device == max(b for b in range(1, per_device + 1) if effective % (world * b) == 0)
        else:  # raised to the next multiple of the world size, learning rate by the square root
            assert plan.effective == -(-effective // world) * world > effective and not plan.kept
            assert plan.learning_rate == pytest.approx(lr * (plan.effective / effective) ** 0.5)
            assert plan.notes()[0].startswith("WARNING: effective batch")
        if plan.per_device != per_device:
            assert any("per-device batch lowered" in note for note in plan.notes())


def test_batch_plan_on_the_cluster_shapes():
    recipe, _ = parse_recipe(["recipe=qwen3_prefix", "run.keep_effective_batch=false"])
    shapes = {world: (p.per_device, p.accumulation, p.effective, round(p.learning_rate, 10))
              for world in (1, 8, 16, 32) for p in [batch_plan(recipe, world)]}
    assert shapes == {1: (2, 8, 16, 2e-5), 8: (2, 1, 16, 2e-5), 16: (1, 1, 16, 2e-5),
                      32: (1, 1, 32, round(2e-5 * 2 ** 0.5, 10))}


def test_keep_effective_batch_refuses_a_world_size_that_cannot():
    recipe, _ = parse_recipe(["recipe=qwen3_prefix", "run.keep_effective_batch=true"])
    assert batch_plan(recipe, 16).effective == 16
    with pytest.raises(RecipeValueError, match="cannot be split over 3 processes"):
        batch_plan(recipe, 3)


@pytest.mark.parametrize("name", ["qwen3_prefix", "llama31_prefix", "gemma3_prefix", "qwen3_distill"])
def test_each_model_trains_on_its_own_answers(name):
    """llama31_prefix and gemma3_prefix used to read lmsys_prefix, Qwen3-8B's answers."""
    from data_builders.config import BuildConfig

    recipe, _ = parse_recipe([f"recipe={name}"])
    builds = [load_config(BuildConfig, [f"recipe={p}"]) for p in sorted((RECIPES_DIR / "data").glob("*.yaml"))]
    (build,) = [b for b in builds if f"outputs/data/{b.name}" == recipe.data.path]
    assert build.answers == "self" and build.model == recipe.model.name_or_path
    assert not recipe.data.answers_from_other_model


@pytest.mark.parametrize("name", ["lmsys_prefix_llama31", "lmsys_prefix_gemma3"])
def test_per_model_builds_differ_from_lmsys_prefix_only_in_name_and_model(name):
    """The per-model builds copy lmsys_prefix (the data format has no inheritance): they must not drift."""
    from dataclasses import asdict

    from data_builders.config import BuildConfig

    ours, qwen = (asdict(load_config(BuildConfig, [f"recipe={n}"])) for n in (name, "lmsys_prefix"))
    assert {k for k in ours if ours[k] != qwen[k]} == {"name", "model"}


def test_system_message_settings_share_the_evaluators_vocabulary():
    recipe, _ = parse_recipe(["data.system_message=incomplete_request"])  # the old spelling, canonicalised
    assert recipe.data.system_message == "incomplete"
    for setting in ("model", "none", "dataset", "You are terse."):
        assert parse_recipe([f"data.system_message={setting}"])[0].data.system_message == setting
    with pytest.raises(RecipeValueError, match="unknown system message setting 'incomplet'"):
        parse_recipe(["data.system_message=incomplet"])
