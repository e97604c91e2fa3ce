"""Kill a run after a checkpoint, relaunch the same command: it ends where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
import wandb
from safetensors.torch import load_file
from test_train_support import (
    REPO,
    humaneval_dialogues,
    launch,
    launch_command,
    launch_env,
    slow_training_env,
    step_losses,
    tiny_overrides,
    write_jsonl,
)

from train.checkpoints import COMPLETE_MARKER

LAUNCHER = ["--num_processes", "1"]


@pytest.fixture
def inherited_wandb_service():
    """A W&B service in this process, announced to its children in WANDB_SERVICE, as a study (or an
    earlier test of this worker) running W&B in-process leaves one."""
    wandb.setup()
    assert "WANDB_SERVICE" in os.environ
    yield
    wandb.teardown()


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_adapter_and_run(tmp_path, tiny_qwen3_dir, inherited_wandb_service):
    """The relaunch ends where an uninterrupted run ends, and (offline W&B) logs to the run its
    first launch opened, also when both launches inherit a W&B service (WANDB_SERVICE) from the
    process that started them: the killed launch's run id stayed open in it and the relaunch was
    refused ("run ID ... is in use") until train/ stopped joining an inherited service."""
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(32))
    full, killed = tmp_path / "full", tmp_path / "killed"
    launch(LAUNCHER, tiny_overrides(tiny_qwen3_dir, data, full))  # W&B changes no loss: the reference has none

    # Same command, slowed down so the kill lands between checkpoint 2 and the end.
    command = launch_command(LAUNCHER, tiny_overrides(tiny_qwen3_dir, data, killed, report_to="[wandb]"))
    process = subprocess.Popen(
        command, cwd=REPO, env=launch_env(**slow_training_env(step_s=2)), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while not (killed / "checkpoint-2" / COMPLETE_MARKER).is_file():
        assert process.poll() is None and time.monotonic() < deadline, "run ended before its first checkpoint"
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGKILL)  # the launcher and its training process, as a preemption would
    process.wait()
    assert not (killed / "adapter").exists(), "the run finished before it was killed"
    # A checkpoint being written when the kill came has no marker and is not resumed from.
    (killed / "checkpoint-4").mkdir(exist_ok=True)

    result = launch(LAUNCHER, tiny_overrides(tiny_qwen3_dir, data, killed, report_to="[wandb]"))
    assert f"resuming from {killed / 'checkpoint-2'}" in result.stdout
    run_id = (killed / "wandb_run_id").read_text().strip()
    runs = sorted(path.name for path in (killed / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs), runs

    assert step_losses(killed) == step_losses(full)
    expected, actual = load_file(full / "adapter" / "adapter_model.safetensors"), load_file(
        killed / "adapter" / "adapter_model.safetensors"
    )
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0)
