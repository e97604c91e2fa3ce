"""The sbatch scripts on a real Slurm: two nodes on this machine (scripts/slurm_local.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import humaneval_dialogues, slow_training_env, tiny_overrides, write_jsonl

from train.checkpoints import COMPLETE_MARKER

REPO = Path(__file__).resolve().parent.parent
SLURM_CONF = os.environ.get("SLURM_CONF", "/tmp/headstart-slurm/slurm.conf")


def cluster_up() -> bool:
    if shutil.which("sbatch") is None or not Path(SLURM_CONF).is_file():
        return False
    result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=slurm_env(), capture_output=True, text=True)
    return result.returncode == 0 and result.stdout.count("idle") + result.stdout.count("mix") >= 2


def slurm_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, SLURM_CONF=SLURM_CONF, WANDB_MODE="offline", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("WANDB_PROJECT", None)
    return env | extra


# The sbatch files ask for whole 8-GPU nodes; the local cluster's nodes have 2 CPUs, no GPU, and may run
# another engineer's jobs beside ours.
CPU_TRAIN = ("--gpus-per-node=0", "--cpus-per-task=1", "--oversubscribe")
CPU_DATA = ("--gpus-per-node=0", "--cpus-per-task=1", "--mem=1G")

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not cluster_up(), reason="no local Slurm: run `bash scripts/slurm_local.sh start`"),
]


def sbatch(*args: str, **env: str) -> str:
    """Submit from the repository root and wait; returns the job id."""
    result = subprocess.run(
        ["sbatch", "--parsable", "--wait", *args], cwd=REPO, env=slurm_env(**env), capture_output=True, text=True,
        timeout=900,
    )
    job_id = result.stdout.strip().split(";")[0]
    log = REPO / "logs" / f"headstart-train-{job_id}.out"
    assert result.returncode == 0, f"{result.stderr}\n{log.read_text()[-4000:] if log.exists() else ''}"
    return job_id


def test_pipeline_chains_data_train_and_before_after_eval(tmp_path, tiny_qwen3_dir):
    data_dir, run_dir, report_dir = tmp_path / "data", tmp_path / "run", tmp_path / "report"
    train = tiny_overrides(tiny_qwen3_dir, data_dir, run_dir, max_steps=2, save_steps=2, merge="false")
    train.append("data.answers_from_other_model=true")  # the embedded rows are SmolLM2's answers, not the tiny model's
    evaluation = [f"model={tiny_qwen3_dir}", f"adapted={run_dir / 'adapter'}", "limit=2", "decode.max_new_tokens=8",
                  f"output_dir={report_dir}"]
    result = subprocess.run(
        ["bash", "slurm/pipeline.sh", "--data", f"recipe=embedded_prefix output_dir={data_dir}",
         "--data-sbatch", " ".join(CPU_DATA),
         "--train", "recipe=smollm2_prefix " + " ".join(train), "--train-sbatch", " ".join(("--nodes=2", *CPU_TRAIN)),
         "--eval", "recipe=before_after_smollm2 " + " ".join(evaluation), "--wait"],
        # The README's ZeRO-3 submission, on CPU nodes: DeepSpeed over gloo, not DDP.
        cwd=REPO, env=slurm_env(ACCELERATE_CONFIG="headstart/recipes/accelerate/zero3.yaml"), capture_output=True, text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (data_dir / "train").is_dir()
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    train_job = re.search(r"-> train (\d+)", result.stdout).group(1)
    assert "processes: 2 (DEEPSPEED)" in (REPO / "logs" / f"headstart-train-{train_job}.out").read_text()
    report = (report_dir / "report.md").read_text()
    assert "Table 2" in report and (report_dir / "figures" / "acceptance.png").is_file()


def test_requeued_training_job_resumes_from_its_last_checkpoint(tmp_path, tiny_qwen3_dir):
    """Preemption as Slurm does it: the running job is requeued and starts over;
    train/sft.py then resumes from the last complete checkpoint (one node: the USR1 test
    below resumes a two-node job)."""
    import time

    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(16))
    out = tmp_path / "run"
    overrides = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=6, save_steps=2)
    submitted = subprocess.run(["sbatch", "--parsable", "--nodes=1", *CPU_TRAIN, "slurm/train.sbatch", *overrides], cwd=REPO,
                               env=slurm_env(**slow_training_env(step_s=4)), capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 600
    while not (out / "checkpoint-2" / "CHECKPOINT_COMPLETE").is_file():
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(1)
    subprocess.run(["scontrol", "requeue", job_id], env=slurm_env(), check=True)
    while job_state(job_id) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
        assert time.monotonic() < deadline + 600, f"job {job_id} did not finish"
        time.sleep(2)
    log = (REPO / "logs" / f"headstart-train-{job_id}.out").read_text()
    assert job_state(job_id) == "COMPLETED", log[-3000:]
    assert "1 nodes x 1 processes" in log and "processes: 1 (MULTI_CPU)" in log  # launched, without --multi_gpu
    assert "restart 1" in log and "resuming from" in log and "checkpoint-" in log
    assert (out / "adapter" / "adapter_config.json").is_file()


def job_state(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=slurm_env(), capture_output=True, text=True)
    fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
    return fields.get("JobState", "UNKNOWN")


def wait_for_end(job_id: str, timeout_s: float) -> str:
    """The final state of a job, polled (a requeued job passes through PENDING again)."""
    deadline = time.monotonic() + timeout_s
    while (state := job_state(job_id)) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
        assert time.monotonic() < deadline, f"job {job_id} did not finish (state {state})"
        time.sleep(2)
    return state


def test_usr1_saves_a_checkpoint_requeues_and_resumes_to_the_uninterrupted_adapter(tmp_path, tiny_qwen3_dir):
    """What Slurm does ahead of a time limit (--signal=B:USR1@300): USR1 to the batch script
    mid-run. The job saves a complete checkpoint where it is, requeues itself, and the requeued
    job resumes from that checkpoint to the adapter an uninterrupted job writes, bit for bit,
    logging to the same W&B run.

    The uninterrupted job is also the README's two-node run (one process per node) and the merge
    past the site's wait time: rank 0 merges alone while the other node's torchrun agent waits at
    its exit barrier, 300 s at most (torch's fixed exit_barrier_timeout), then ends its task; Slurm
    gives the rest of the step WaitTime seconds (2 here). Without `srun --wait=0` a merge longer than
    300 s (an 8-12B base in float32 on CPU) was killed and left no merged model. Here the barrier is
    cut to 20 s (tests/support/sitecustomize.py) and the merge held 60 s: the same kill, minutes sooner."""
    shown = subprocess.run(["scontrol", "show", "config"], env=slurm_env(), capture_output=True, text=True).stdout
    assert "WaitTime                = 2 sec" in shown, "the local cluster should set WaitTime=2"
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(16))
    full, preempted = tmp_path / "full", tmp_path / "preempted"
    # No periodic checkpoint before the last step: the one the requeued job resumes from is USR1's.
    settings = dict(max_steps=6, save_steps=100, report_to="[wandb]")
    full_job = sbatch("--nodes=2", *CPU_TRAIN, "slurm/train.sbatch",
                      *tiny_overrides(tiny_qwen3_dir, data, full, **settings | {"merge": "true"}),
                      **slow_training_env(merge_s=60, exit_barrier_s=20))
    full_log = (REPO / "logs" / f"headstart-train-{full_job}.out").read_text()
    assert "2 nodes x 1 processes" in full_log and "processes: 2 (MULTI_CPU)" in full_log, full_log[-3000:]
    assert (full / "merged" / "config.json").is_file() and (full / "adapter" / "adapter_config.json").is_file()
    assert f"merged: {full / 'merged'}" in full_log
    assert "Error waiting on exit barrier" in full_log  # the short barrier did end the other node's task mid-merge

    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", *CPU_TRAIN, "slurm/train.sbatch",
         *tiny_overrides(tiny_qwen3_dir, data, preempted, **settings)],
        cwd=REPO, env=slurm_env(**slow_training_env(step_s=3)), capture_output=True, text=True, check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    log = REPO / "logs" / f"headstart-train-{job_id}.out"
    deadline = time.monotonic() + 600
    # USR1 once the first of six steps (3 s or more each) is done (the step delay says so in the log).
    while not re.search(r"STEP_DELAY_S: step [1-4] done", log.read_text() if log.is_file() else ""):
        assert time.monotonic() < deadline and job_state(job_id) in ("PENDING", "RUNNING"), "training never started"
        time.sleep(0.5)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=slurm_env(), check=True)
    state = wait_for_end(job_id, 900)
    text = log.read_text()
    assert state == "COMPLETED", text[-4000:]

    stopped = re.search(r"stopped at step (\d+) on request", text)
    assert stopped and "USR1: saving a checkpoint" in text, text[-4000:]
    step = int(stopped.group(1))
    assert 1 <= step < 6, f"USR1 did not land mid-run (step {step})"
    assert f"requeueing job {job_id}" in text and "restart 1" in text
    assert (preempted / f"checkpoint-{step}" / COMPLETE_MARKER).is_file()
    assert f"resuming from {preempted / f'checkpoint-{step}'}" in text

    expected = load_file(full / "adapter" / "adapter_model.safetensors")
    actual = load_file(preempted / "adapter" / "adapter_model.safetensors")
    assert actual.keys() == expected.keys()
    for key in expected:
        assert torch.equal(actual[key], expected[key]), key

    # Both launches of the preempted job logged to one W&B run: the id kept in the run directory.
    run_id = (preempted / "wandb_run_id").read_text().strip()
    runs = sorted(path.name for path in (preempted / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{run_id}") for name in runs), runs
