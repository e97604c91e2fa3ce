"""`--help` (and `-h`) on every entry point: exit 0, the usage line, every section and field with
its type, default and help, printed before the recipe, a model or data is read.

The renderer is headstart.config.render_help (one home for all entry points). What an entry
point imports before it answers is its config schemas' modules: light ones (DecodeSpec,
headstart.vllm_settings, headstart.device_names), so that the evaluator, the data builder,
the study and train.memory answer without torch or transformers (TORCH_FREE); train/sft.py
and train.download need TRL (the `training:` section's help is SFTConfig's own field
metadata), and the verifier study and train.merge still import torch at their top: those
answer in the test's own process.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from in_process import run_here

from headstart.config import HelpShown, cli_main, load_config, render_help, run_cli

REPO = Path(__file__).resolve().parent.parent

# Entry point -> (its command after `python`, its schema, sections its help must name, fields
# with the start of their help).
ENTRY_POINTS = {
    "eval": (["-m", "eval"], "eval.evaluation.config:EvalConfig", ["decode", "vllm"],
             {"limit": "Evaluate only the first N", "decode.acceptance": "Acceptance rule"}),
    "eval.before_after": (["-m", "eval.before_after"], "eval.before_after:BeforeAfterConfig", ["decode"],
                          {"adapted": "Adapted model", "decode.max_new_tokens": "Answer length cap"}),
    "eval.live": (["-m", "eval.live"], "eval.live:LiveConfig", ["decode", "vllm"], {"decode.engine": "AR:"}),
    "eval.serve": (["-m", "eval.serve"], "eval.serve:ServeConfig", ["decode", "vllm"],
                   {"drafts": "Verify drafts as speculative proposals", "session_ttl": "Seconds after its last text"}),
    "data_builders": (["-m", "data_builders"], "data_builders.config:BuildConfig",
                      ["lmsys", "mbpp", "filters", "caps", "decontamination", "generation"], {}),
    "train/sft.py": (["train/sft.py"], "train.config:TrainRecipe",
                     ["model", "data", "lora", "run", "training", "refusion", "distill", "sdft", "wandb"],
                     {"run.effective_batch_size": "sequences per optimizer step",
                      "training.learning_rate": "The initial learning rate"}),
    "study": (["benchmarks/study_adaptation.py"], "study_adaptation:StudyConfig", [], {}),
    "train.merge": (["-m", "train.merge"], "train.merge:MergeArgs", [], {}),
    "train.download": (["-m", "train.download"], "train.config:TrainRecipe", ["model", "training"], {}),
    "train.memory": (["-m", "train.memory"], "train.memory:MemoryArgs", [], {"gpus": "GPUs the run is launched on"}),
    "study_verifier": (["benchmarks/study_verifier.py"], "study_verifier:VerifierCheckConfig", [], {}),
    "eval.width_cost": (["-m", "eval.width_cost"], "eval.width_cost:WidthCostConfig", [], {"repeats": "Timed forwards"}),
}
# Entry points whose `--help` imports neither torch nor transformers.
TORCH_FREE = {"eval", "eval.before_after", "eval.live", "eval.serve", "data_builders", "study", "train.memory", "eval.width_cost"}
HEAVY = ("torch", "transformers")


def schema(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def fields_without_help(config: type, prefix: str = "") -> list[str]:
    """Every field of `config` and of its nested sections whose help is missing or empty."""
    missing = []
    for f in dataclasses.fields(config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if not str(f.metadata.get("help", "")).strip():
            missing.append(prefix + f.name)
        if dataclasses.is_dataclass(default):
            missing += fields_without_help(type(default), f"{prefix}{f.name}.")
    return missing


def answer(command: list[str], flag: str = "--help") -> subprocess.CompletedProcess:
    """The entry point run with a recipe that does not exist and `flag`: the help wins, so nothing
    of the recipe (or a model, or data) was read. `-X importtime` lists what it imported."""
    # the checkout under test first on PYTHONPATH, whichever copy of the packages is installed
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=path)
    return subprocess.run([sys.executable, "-X", "importtime", *command, "recipe=no_such_recipe", flag],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def imported(result: subprocess.CompletedProcess) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}


def answer_here(command: list[str]) -> subprocess.CompletedProcess:
    """`answer` in this process: an entry point that imports torch anyway pays for it once here,
    not in a fresh interpreter each (TRL's SFTConfig alone is 10 CPU-s); no import list."""
    code, out, err = run_here(["python", *command, "recipe=no_such_recipe", "--help"], {})  # run_here sets offline
    return subprocess.CompletedProcess(command, code, out, err)


@pytest.fixture(scope="module")
def answers() -> dict[str, subprocess.CompletedProcess]:
    """Every entry point's `--help`: the torch-free ones in fresh interpreters side by side, with
    their import lists; the others in this process."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(answer, command) for name, (command, *_) in ENTRY_POINTS.items()
                   if name in TORCH_FREE}
        found = {name: future.result() for name, future in futures.items()}
    return found | {name: answer_here(command) for name, (command, *_) in ENTRY_POINTS.items() if name not in found}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_entry_point_answers_help(answers, name):
    result = answers[name]
    command, _, sections, fields = ENTRY_POINTS[name]
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"\nusage: python {' '.join(command)} " in f"\n{out}", out[:300]  # a library may log a line first
    for section in sections:
        assert f"\n{section}: " in out, f"section {section} missing from {name} --help"
    for key, help_start in fields.items():
        assert f"\n  {key} (" in out and help_start in out.split(f"\n  {key} (", 1)[1].split("\n  ")[1], key
    lines = out.splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith("  ") and not line.startswith("   ") and "(" in line]
    assert rows, out
    no_help = [lines[i] for i in rows if i + 1 >= len(lines) or not lines[i + 1].startswith("      ")]
    assert not no_help, f"{name}: keys without help: {no_help}"
    if name in TORCH_FREE:
        heavy = [module for module in HEAVY if module in imported(result)]
        assert heavy == [], f"{name} --help imported {heavy}: {importer_chain(result, heavy[0])}"


def importer_chain(result: subprocess.CompletedProcess, module: str) -> list[str]:
    """The modules whose import led to `module`'s, outermost first (-X importtime lists a
    module after what it imported, one indent level deeper)."""
    rows = [line.split("|", 2)[2] for line in result.stderr.splitlines() if line.startswith("import time:")]
    names = [row.strip() for row in rows]
    depth = {i: len(row) - len(row.lstrip()) for i, row in enumerate(rows)}
    index = names.index(module)
    chain, level = [module], depth[index]
    for i in range(index + 1, len(rows)):
        if depth[i] < level:
            chain.insert(0, names[i])
            level = depth[i]
    return chain


def test_short_flag_answers_too():
    """Fast: train.memory answers without torch (its recipe loader is imported after the help)."""
    result = answer(ENTRY_POINTS["train.memory"][0], "-h")
    assert not set(HEAVY) & imported(result)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage: python -m train.memory " in result.stdout and "\n  card_gib (float, default 80.0)" in result.stdout


def test_evaluator_help_loads_neither_torch_nor_transformers():
    """Fast: the evaluator's schemas live in light modules (the slow test checks every entry point)."""
    result = answer(ENTRY_POINTS["eval"][0], "-h")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not set(HEAVY) & imported(result), importer_chain(result, min(set(HEAVY) & imported(result)))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({path for _, path, *_ in ENTRY_POINTS.values()}))
def test_every_field_of_every_schema_has_help(name):
    assert fields_without_help(schema(name)) == []


# --- The renderer and the exit path, on a schema of the test's own ------------------------------

@dataclasses.dataclass
class Inner:
    rate: float = dataclasses.field(default=0.5, metadata={"help": "how fast"})


def extra_rows():
    return [("steps", "int", 10, "how many steps")]


@dataclasses.dataclass
class Outer:
    """A schema for the test."""

    name: str = dataclasses.field(default="x", metadata={"help": "the name"})
    tags: list[str] = dataclasses.field(default_factory=lambda: ["a", "b"], metadata={"help": "some tags"})
    inner: Inner = dataclasses.field(default_factory=Inner, metadata={"help": "the inner section"})
    extra: dict = dataclasses.field(default_factory=dict, metadata={"help": "a mapping checked elsewhere",
                                                                    "help_rows": extra_rows})


def test_render_help_lists_keys_sections_and_hook_rows(tmp_path):
    (tmp_path / "fits.yaml").write_text("name: y\ninner:\n  rate: 1.0\n")
    (tmp_path / "other.yaml").write_text("unknown: 1\n")
    text = render_help(Outer, "python -m thing", recipes_dir=tmp_path)
    assert text.startswith("usage: python -m thing recipe=NAME key=value section.key=value ...\n")
    assert "A schema for the test." in text
    assert "  fits\n" in text and "other" not in text  # only the recipes whose keys the schema takes
    assert "top-level keys:\n  name (str, default x)\n      the name\n  tags (list[str], default [a, b])" in text
    assert "\ninner: the inner section\n  inner.rate (float, default 0.5)\n      how fast\n" in text
    assert "\nextra: a mapping checked elsewhere\n  extra.steps (int, default 10)\n      how many steps\n" in text


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_anywhere_exits_zero_before_the_recipe(flag, capsys):
    with pytest.raises(HelpShown) as raised:
        load_config(Outer, ["recipe=no_such_recipe", "name=z", flag])
    assert raised.value.code == 0
    assert "inner.rate" in capsys.readouterr().out
    assert run_cli(Outer, lambda config: pytest.fail("ran"), [flag]) == 0
    assert cli_main(lambda: load_config(Outer, [flag])) == 0


def test_without_help_the_recipe_is_still_checked():
    assert cli_main(lambda: load_config(Outer, ["recipe=no_such_recipe"])) == 2
