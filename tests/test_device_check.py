"""The device check (scripts/device_check.sh): its CPU twin runs every stage here, so the GPU
check cannot rot unseen; its output directory is its own; and training recognises the
embedded model under the name of its converted directory (the old gpu_check.sh trained
`model.name_or_path=<that directory>` on `answer_model=smollm2` rows and was refused)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from datasets import Dataset
from device_check.eval_stages import EVAL_REQUESTS, IDENTITY_POLICIES, PolicyRun, compared_figure, measured_share, tree_figure
from device_check.run import STAGES, CheckError, claim_output_dir  # scripts/ is on pytest's pythonpath

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "device_check.sh"

from headstart.run_dir import MARK  # noqa: E402


def self_distilled_rows(model: str) -> Dataset:
    row = {"messages": [{"role": "user", "content": "Write a function"}, {"role": "assistant", "content": "def f(): pass"}],
           "answer_kind": "self", "answer_model": model}
    return Dataset.from_list([row, row])


def test_smollm2_answers_train_smollm2_under_any_of_its_names():
    """The converted directory and the GGUF file are the model `smollm2` names; another model is not."""
    from headstart.models import embedded_gguf_path, resolve_model_dir
    from train.provenance import check_answer_models, same_model

    data = self_distilled_rows("smollm2")
    converted = resolve_model_dir("smollm2")
    assert check_answer_models(data, "d", converted, allowed=False) == []
    assert check_answer_models(data, "d", converted + "/", allowed=False) == []
    assert check_answer_models(data, "d", str(embedded_gguf_path("smollm2")), allowed=False) == []
    assert same_model("SmolLM2-135M-Instruct", "smollm2-135m-instruct")  # the alias, in any case
    with pytest.raises(ValueError, match=r"answers written by smollm2, not by the model trained here"):
        check_answer_models(data, "d", "HuggingFaceTB/SmolLM2-360M-Instruct", allowed=False)
    # A directory merely named like a converted one, outside the cache, keeps its whole name.
    assert not same_model("smollm2", "/models/SmolLM2-135M-Instruct.Q4_1-0123456789ab")


def test_a_directory_without_the_marker_is_refused_and_left_whole(tmp_path):
    """The old gpu_check.sh ran `rm -rf` on whatever path it was given."""
    users = tmp_path / "results"
    users.mkdir()
    (users / "thesis.tex").write_text("months of work\n")
    result = subprocess.run(["bash", str(SCRIPT), "--cpu", str(users)], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert f"{users} is not empty (thesis.tex) and holds no {MARK}" in result.stderr and "nothing is written" in result.stderr
    assert (users / "thesis.tex").read_text() == "months of work\n" and not (users / MARK).exists()


def test_only_a_marked_directory_is_emptied(tmp_path):
    new = tmp_path / "new" / "check"
    claim_output_dir(new, replace=True)  # created, parents too, and marked
    assert (new / MARK).is_file()
    (new / "old-stage").mkdir()
    (new / "old-stage" / "log").write_text("x")
    claim_output_dir(new, replace=False)  # a stage rerun keeps what the other stages wrote
    assert (new / "old-stage" / "log").is_file()
    claim_output_dir(new, replace=True)  # a full run replaces it
    assert sorted(p.name for p in new.iterdir()) == [MARK]
    empty = tmp_path / "empty"
    empty.mkdir()
    claim_output_dir(empty, replace=True)
    assert (empty / MARK).is_file()
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckError, match="is a file, not a directory"):
        claim_output_dir(tmp_path / "file", replace=True)


def test_the_identity_stage_fails_without_tree_forwards_or_a_compared_request():
    """What the CPU twin cannot provoke: a tree policy that ran only chains, a request not compared, an
    evaluator that reports no comparison (before issue 47) all fail; a share is read as k/n."""
    records = [{"residual_forwards": 3, "engine": "fast"}] * 2
    measured = {"identical_measured": 2, "identical_to_baseline": 0.5, "drafter_compared": 0}
    runs = {"lookup": PolicyRun(records, measured, []), "tree": PolicyRun(records, measured, [])}
    assert tree_figure(runs, "sdpa").ok is False
    runs["tree"] = PolicyRun(records, measured, [4, 9])
    assert tree_figure(runs, "sdpa").ok and tree_figure(runs, "sdpa").value == "0 / 2 (widest 9 nodes; attention sdpa)"
    assert tree_figure({**runs, "lookup": PolicyRun(records, measured, [3])}, "sdpa").ok is False  # a chain policy ran a tree
    assert compared_figure(runs).ok
    assert measured_share(measured, "identical_measured", "identical_to_baseline") == "1/2 compared"
    assert measured_share(measured, "drafter_compared", "drafter_agreement") == "0 compared"
    runs["lookup"] = PolicyRun(records, {"identical_measured": 1}, [])
    assert compared_figure(runs).ok is False
    runs["lookup"] = PolicyRun(records, {}, [])
    assert compared_figure(runs).ok is False and "not reported" in compared_figure(runs).value
    assert measured_share({}, "drafter_compared", "drafter_agreement").startswith("not reported")


@pytest.mark.slow
def test_the_cpu_twin_runs_every_stage_and_reruns_one_alone(tmp_path):
    out = tmp_path / "check"
    result = subprocess.run(["bash", str(SCRIPT), "--cpu", str(out)], cwd=REPO, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    figures = json.loads((out / "figures.json").read_text())
    assert list(figures) == list(STAGES)
    for stage, found in figures.items():
        assert found["error"] is None and all(f["ok"] is not False for f in found["figures"]), (stage, found)
    checked = {(stage, f["name"]) for stage, found in figures.items() for f in found["figures"] if f["ok"]}
    assert {("train", "precision / checkpointing / attention"), ("zero3", "launch"),
            ("zero3", "merged vs adapter-on logits (fp32): max abs diff"), ("objectives", "distill: loss per step"),
            ("objectives", "refusion: loss per step"), ("memory", "checkpointing keeps fewer activations"),
            ("timing", "residual forwards equal in every run"),
            ("stream", "cpu: streamed answer identical to baseline"),
            ("identity", "requests compared token for token: plain / lookup / tree"),
            ("identity", "records from the fast path (drafts in padded batches)"),
            ("identity", "token-tree forwards (4D mask): plain / lookup / tree"),
            ("widths", "table read back by decode.width_cost")} <= checked
    assert_identity_measured(figures["identity"]["figures"])
    table = (out / "figures.md").read_text()
    assert table in result.stdout and "| zero3 | launch | processes: 1 (DEEPSPEED)" in table

    # One stage again (the quickest): the assets are reused, the other stages' figures kept.
    first = (out / "assets" / "tiny-qwen3" / "config.json").stat().st_mtime_ns
    again = subprocess.run(["bash", str(SCRIPT), "--cpu", "--stage", "stream", str(out)], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "=== stream" in again.stdout and "=== train" not in again.stdout
    assert (out / "assets" / "tiny-qwen3" / "config.json").stat().st_mtime_ns == first
    assert list(json.loads((out / "figures.json").read_text())) == list(STAGES)
    assert (out / "train" / "run" / "adapter").is_dir()


def assert_identity_measured(figures: list[dict]) -> None:
    """The identity stage's bf16 shares are measurements (ok None), each over all 6 requests: every one was
    compared with its batch-1 baseline, and the drafter's D_n with it too (every request is timed)."""
    by_name = {f["name"]: f for f in figures}
    for policy in IDENTITY_POLICIES:
        for name in (f"{policy}: streamed answer identical to batch-1 baseline",
                     f"{policy}: drafter D_n (batched) agrees with batch-1 baseline"):
            figure = by_name[name]
            assert re.fullmatch(rf"\d/{EVAL_REQUESTS} compared", figure["value"]), figure
            assert figure["ok"] is None and figure["compare"] == "fp32 is lossless; bf16 measured", figure
