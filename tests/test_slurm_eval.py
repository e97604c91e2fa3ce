"""Sharded evaluation on a real Slurm (scripts/slurm_local.sh: two nodes on this machine):
an array of slurm/eval.sbatch tasks, one shard each, then the merge job (afterok)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from test_before_after import make_adapter
from test_eval_shards import assert_same_results, shard_ids, untimed, untimed_markdown
from test_slurm import REPO, cluster_up, slurm_env

from eval.before_after import BeforeAfterConfig, run_before_after
from eval.engines.decode import DecodeSpec

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(not cluster_up(), reason="no local Slurm: run `bash scripts/slurm_local.sh start`"),
]


def test_a_two_task_array_and_its_merge_job_write_the_unsharded_report(tmp_path, tiny_qwen3_dir):
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "adapter")
    whole, out = tmp_path / "whole", tmp_path / "sharded"
    args = [f"model={tiny_qwen3_dir}", f"adapted={adapter}", "limit=3", "decode.max_new_tokens=8"]
    run_before_after(BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(adapter), limit=3,
                                       decode=DecodeSpec(max_new_tokens=8), output_dir=str(whole)))
    # A job the evaluation comes after (training, in slurm/pipeline.sh).
    before = subprocess.run(["sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 2"], cwd=REPO, env=slurm_env(),
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    # --exclusive: a whole node per task, so the two shards run at once on two nodes (the cluster has four:
    # two stay free whatever the other stream of Slurm tests runs, tests/conftest.py).
    result = subprocess.run(["bash", "slurm/eval_sharded.sh", "2", "--sbatch", f"--exclusive --output={tmp_path}/task-%a.out",
                             "--merge-sbatch", "", "--after", before, "--wait", *args, f"output_dir={out}"], cwd=REPO,
                            env=slurm_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = [(tmp_path / f"task-{i}.out").read_text() for i in range(2)]
    assert "shard=0/2" in tasks[0] and "shard=1/2" in tasks[1]
    nodes = [re.search(r" on (n\d):", log).group(1) for log in tasks]
    assert len(set(nodes)) == 2, nodes
    merge_job = result.stdout.split()[-1]
    log = (REPO / "logs" / f"headstart-eval-{merge_job}.out").read_text()
    assert "(merge and report)" in log and "report:" in log
    for side in ("before", "after"):
        ids = shard_ids(whole / side / "humaneval")
        shards = out / side / "humaneval" / "shards"
        # Each array task evaluated its own shard: disjoint, together all, in this order.
        assert [shard_ids(shards / f"{i}-of-2") for i in range(2)] == [ids[0::2], ids[1::2]]
        assert_same_results(out / side / "humaneval", whole / side / "humaneval")
    assert untimed_markdown((out / "report.md").read_text()) == untimed_markdown(
        (whole / "report.md").read_text().replace(str(whole), str(out)))
    assert untimed(json.loads((out / "summary.json").read_text())) == untimed(json.loads((whole / "summary.json").read_text()))


def test_an_array_that_does_not_start_at_zero_is_refused(tmp_path, tiny_qwen3_dir):
    """--array=1-2 would leave shard 0 (a third of the requests) to nobody."""
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--wait", "--array=1-2", f"--output={tmp_path}/task-%a.out", "slurm/eval.sbatch",
         f"model={tiny_qwen3_dir}", f"adapted={tiny_qwen3_dir}", "limit=2", f"output_dir={tmp_path / 'out'}"],
        cwd=REPO, env=slurm_env(), capture_output=True, text=True, timeout=600)
    assert submitted.returncode != 0
    assert "the array must be 0-1 (one task per shard), not 1-2 with 2 tasks" in (tmp_path / "task-1.out").read_text()
    assert not (tmp_path / "out").exists()


def test_a_failed_shard_cancels_the_merge_job(tmp_path, tiny_qwen3_dir):
    """The merge waits on every task (afterok); one that fails cancels it instead of leaving it pending."""
    result = subprocess.run(["bash", "slurm/eval_sharded.sh", "2", "--sbatch", f"--output={tmp_path}/task-%a.out",
                             "--merge-sbatch", "", "--wait", f"model={tiny_qwen3_dir}", f"adapted={tmp_path / 'absent'}",
                             "limit=2", f"output_dir={tmp_path / 'out'}"],
                            cwd=REPO, env=slurm_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "not found" in (tmp_path / "task-0.out").read_text()
    # The merge job was cancelled, never run (sbatch --wait alone would have exited 0), and said so.
    assert "ended CANCELLED, not COMPLETED" in result.stderr and not (tmp_path / "out").exists()


def test_a_serving_job_answers_over_http_until_cancelled(tmp_path):
    """slurm/serve.sbatch on a node of the local cluster: the log names the address, the OpenAI route
    answers (vLLM on the CPU, the embedded SmolLM2), scancel ends it."""
    import socket
    import time

    import httpx

    from headstart.vllm_client import vllm_unavailable

    if vllm_unavailable():
        pytest.skip(f"vLLM not testable: {vllm_unavailable()}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.out"
    job = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=0", "--cpus-per-task=1", "--oversubscribe",
                          f"--output={log}", "slurm/serve.sbatch", f"port={port}", "decode.max_new_tokens=16",
                          "vllm.cpu_kv_cache_gib=1"], cwd=REPO, env=slurm_env(), capture_output=True, text=True,
                         check=True).stdout.strip().split(";")[0]
    try:
        deadline, reply = time.monotonic() + 600, None
        while time.monotonic() < deadline:
            text = log.read_text() if log.is_file() else ""
            match = re.search(r"serving on http://([^:]+):(\d+)/v1", text)
            if match:
                try:
                    reply = httpx.post(f"http://127.0.0.1:{match.group(2)}/v1/chat/completions", timeout=60,
                                       json={"messages": [{"role": "user", "content": "Add two numbers in Python."}]})
                    break
                except httpx.HTTPError:
                    pass
            time.sleep(2)
        assert reply is not None and reply.status_code == 200, log.read_text()
        assert len(reply.json()["headstart"]["token_ids"]) <= 16
    finally:
        subprocess.run(["scancel", job], env=slurm_env(), check=False)
