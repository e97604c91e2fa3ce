"""train/sft.py and train/merge.py: runs never mix, bad input is a clear error (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from datasets import Dataset
from test_train_support import REPO, humaneval_dialogues, launch_env, sft_here, step_losses, tiny_overrides, write_jsonl

from headstart.config import dump_config, load_config
from headstart.run_dir import write_mark
from train.checkpoints import COMPLETE_MARKER
from train.config import RecipeValueError, TrainRecipe
from train.data import load_split
from train.merge import main as merge_main
from train.relaunch import RESUMABLE_KEYS, RUN_KIND, check_run_dir
from train.tokenization import tokenize_dataset


def sft(overrides: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """`python train/sft.py OVERRIDES` (one process: the launcher adds nothing these tests need)."""
    return subprocess.run([sys.executable, "train/sft.py", "recipe=smollm2_prefix", *overrides], cwd=REPO,
                          env=launch_env(), capture_output=True, text=True, timeout=timeout)


def test_a_run_dir_refuses_another_recipe_and_lists_the_keys(tmp_path, tiny_qwen3_dir, capsys):
    """Relaunching into a finished run with another learning rate used to resume it and
    run 0 steps, and overwrite its config.yaml."""
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(8))
    out = tmp_path / "run"
    first = sft(tiny_overrides(tiny_qwen3_dir, data, out, max_steps=2, save_steps=1))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = (out / "config.yaml").read_text()
    losses = step_losses(out)

    code = sft_here(["recipe=smollm2_prefix",
                     *tiny_overrides(tiny_qwen3_dir, data, out, max_steps=2, save_steps=1, learning_rate=1e-3)])
    refused = capsys.readouterr().err
    assert code == 2, refused[-3000:]
    assert "training.learning_rate: 0.01 -> 0.001" in refused
    assert "choose another training.output_dir" in refused and "Traceback" not in refused
    assert (out / "config.yaml").read_text() == saved and step_losses(out) == losses


def test_resumable_keys_may_change_and_the_others_may_not(tmp_path):
    recipe = load_config(TrainRecipe, ["recipe=smollm2_prefix"])
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / "checkpoint-2" / COMPLETE_MARKER).write_text("2\n")
    dump_config(recipe, run / "config.yaml")
    write_mark(run, RUN_KIND)
    assert check_run_dir(run, recipe) == {}
    longer = replace(recipe, training={**recipe.training, "max_steps": 40, "save_steps": 5, "logging_steps": 2})
    assert check_run_dir(run, longer) == {"training.max_steps": (20, 40), "training.save_steps": (10, 5),
                                         "training.logging_steps": (1, 2)}
    assert {"training.max_steps", "training.save_steps", "training.eval_steps", "training.logging_steps"} <= set(RESUMABLE_KEYS)
    for changed in (replace(recipe, training={**recipe.training, "seed": 1}),
                    replace(recipe, lora=replace(recipe.lora, r=16)),
                    replace(recipe, data=replace(recipe.data, path="other"))):
        with pytest.raises(RecipeValueError, match="holds a run of another recipe"):
            check_run_dir(run, changed)
    with pytest.raises(RecipeValueError, match="run.resume=false"):
        check_run_dir(run, replace(recipe, run=replace(recipe.run, resume=False)))
    (run / "config.yaml").unlink()
    with pytest.raises(RecipeValueError, match="no config.yaml"):
        check_run_dir(run, recipe)


def test_bad_training_data_names_the_file_the_line_the_row_and_the_field(tmp_path, tiny_tokenizer):
    """Today: StopIteration (empty file), DatasetGenerationError (a bad line, no line
    named), TypeError (a row without `messages`)."""
    rows = humaneval_dialogues(4)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_split(str(empty), "train")
    lines = [json.dumps(row) for row in rows]
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("\n".join([lines[0], lines[1], lines[2][:50], lines[3]]) + "\n")
    with pytest.raises(ValueError, match=rf"{corrupt}:3: not a JSON line"):
        load_split(str(corrupt), "train")
    missing = [dict(row) for row in rows]
    missing[2] = {"msgs": rows[2]["messages"], "source": "x"}
    with pytest.raises(ValueError, match=r"row 3 \(counting from 1\): field `messages` is missing"):
        tokenize_dataset(Dataset.from_list(missing), tiny_tokenizer, "chatml", "incomplete_request")
    no_answer = [dict(row) for row in rows]
    no_answer[1] = dict(rows[1], messages=rows[1]["messages"][:-1])
    with pytest.raises(ValueError, match=r"row 2 .*must end with an assistant turn"):
        tokenize_dataset(Dataset.from_list(no_answer), tiny_tokenizer, "chatml", "incomplete_request")
    with pytest.raises(ValueError, match="holds no rows"):
        load_split(str(write_dataset(tmp_path / "saved")), "train")


def test_a_saved_dataset_whose_json_is_not_utf8_is_named(tmp_path, monkeypatch):
    """`error: 'utf-8' codec can't decode byte 0xff in position 15: invalid start byte` used to be
    all a run said of a damaged dataset_dict.json or state.json (or DeepSpeed config): no file."""
    from datasets import DatasetDict

    from train.topology import deepspeed_zero_stage

    rows = Dataset.from_list(humaneval_dialogues(2))
    listing, state = tmp_path / "a" / "dataset_dict.json", tmp_path / "b" / "train" / "state.json"
    for directory in (tmp_path / "a", tmp_path / "b"):
        DatasetDict({"train": rows}).save_to_disk(str(directory))
    listing.write_bytes(b'{"splits": ["tr\xffain"]}')
    with pytest.raises(ValueError, match=rf"^{listing}: not UTF-8 text \(line 1, byte 15\)"):
        load_split(str(tmp_path / "a"), "train")
    state.write_bytes(b'{"_data_files": [\n{"\xff": 1}]}')
    with pytest.raises(ValueError, match=rf"^{state}: not UTF-8 text \(line 2, "):
        load_split(str(tmp_path / "b"), "train")
    deepspeed = tmp_path / "zero2.json"
    deepspeed.write_bytes(b'{"zero_optimization": {"stage": 2, "\xe9t\xe9": 1}}')
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(deepspeed))
    with pytest.raises(ValueError, match=rf"^{deepspeed}: not UTF-8 text \(line 1, "):
        deepspeed_zero_stage()


def write_dataset(path):
    from datasets import DatasetDict

    rows = Dataset.from_list(humaneval_dialogues(1))
    DatasetDict({"train": rows.select([]), "validation": rows}).save_to_disk(str(path))
    return path


def test_sft_reports_recipe_and_data_errors_with_exit_code_2_and_writes_nothing(tmp_path, tiny_qwen3_dir, capsys):
    """In this process, as `python train/sft.py` runs its body (tests/test_bad_inputs.py has more cases)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "run"
    for overrides, message in (
        (tiny_overrides(tiny_qwen3_dir, empty, out), "the file holds no rows"),
        (tiny_overrides(tiny_qwen3_dir, tmp_path / "absent.jsonl", out), "data file not found"),
        (["training.learnig_rate=1e-4", f"training.output_dir={out}"], "unknown key training.learnig_rate"),
    ):
        code = sft_here(["recipe=smollm2_prefix", *overrides])
        stderr = capsys.readouterr().err
        assert code == 2, stderr[-3000:]
        assert "error: " in stderr and message in stderr and "Traceback" not in stderr
        assert not out.exists()  # not even config.yaml


def test_merge_reports_errors_with_exit_code_2(tmp_path, capsys):
    assert merge_main([]) == 2
    assert "usage: python -m train.merge" in capsys.readouterr().err
    assert merge_main([f"adapter={tmp_path}", f"output={tmp_path / 'merged'}"]) == 2
    assert "not a LoRA adapter directory" in capsys.readouterr().err
    assert merge_main([f"adapter={tmp_path}", f"output={tmp_path / 'merged'}", "dtype=float64x"]) == 2
    assert "dtype='float64x': use float32, bfloat16" in capsys.readouterr().err
    assert merge_main(["adaptr=x"]) == 2
    assert "unknown key adaptr" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()
