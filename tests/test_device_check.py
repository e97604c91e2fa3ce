"""The device check (scripts/device_check.sh): its CPU twin runs every stage here, so the GPU
check cannot rot unseen; its output directory is its own; and training recognises the
embedded model under the name of its converted directory (the old gpu_check.sh trained
`model.name_or_path=<that directory>` on `answer_model=smollm2` rows and was refused)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from datasets import Dataset
from device_check import STAGES, CheckError, claim_output_dir  # scripts/ is on pytest's pythonpath

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
            ("widths", "table read back by decode.width_cost")} <= checked
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
