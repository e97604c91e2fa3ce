"""The adaptation study (benchmarks/study_adaptation.py): checkpoint spacing, refusals, the merged
models its evaluations load, and the whole study on the embedded model, killed and resumed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from study_adaptation import StudyConfig, evaluated_model
from test_before_after import make_adapter
from test_train_support import REPO, launch_env

from headstart.config import load_config
from headstart.models import load_model
from headstart.prompts import read_training_record


def test_a_final_run_checkpoints_often_and_on_every_curve_point():
    """The recipe: 160 steps, a curve point at 80, a checkpoint every 20 (sdft's 40: every 20).
    400 steps in 4 points (every 100) checkpoint every 20; 100 in 4 (every 25) every 5, the
    largest spacing within 20 that lands on each curve point."""
    config = load_config(StudyConfig, ["recipe=study_smollm2"])
    assert (config.max_steps, config.curve_points, config.checkpoint_steps) == (160, 2, 20)
    assert config.save_steps("sft") == config.save_steps("sdft") == 20
    longer = load_config(StudyConfig, ["recipe=study_smollm2", "max_steps=400", "curve_points=4", "objective_steps={sdft: 100}"])
    assert longer.save_steps("sft") == 20 and longer.save_steps("sdft") == 5


@pytest.mark.parametrize(("bad", "message"), [(["checkpoint_steps=0"], "checkpoint_steps >= 1"),
                                              (["curve_points=3"], "multiple of curve_points=3"),
                                              (["objective_steps={refusion: 5}"], "not objectives of the study"),
                                              (["eval.benchmarks=[humaneval,mpbb]"], r"name \['mpbb'\], not benchmarks"),
                                              (["eval.data_paths={humaneva: x.jsonl}"], r"name \['humaneva'\]"),
                                              (["eval.system_prompt=model"], "one system message"),
                                              (["eval.system_prompt=dataset"], "training data only"),
                                              (["eval.adapted=x"], "eval: adapted is set by the study"),
                                              (["train.training.learning_rate=1"], "train: training.learning_rate is set"),
                                              (["effective_batch_size=8"], "unknown key effective_batch_size")])
def test_bad_study_settings_are_refused_before_any_work(bad, message):
    with pytest.raises(ValueError, match=message):
        load_config(StudyConfig, ["recipe=study_smollm2", *bad])


def test_the_study_nests_train_and_eval_settings_it_does_not_copy():
    """`train:` reaches every objective's recipe as train/sft.py reads it (a bad key refused by the
    recipe's own check), `eval:` is the before/after config; the evaluation's system message is the
    training rows'; the recipes must agree on the data build's cap."""
    from study_adaptation import train_recipes

    from train.config import RecipeValueError

    config = load_config(StudyConfig, ["recipe=study_smollm2", "eval.limit=20", "eval.system_prompt=none",
                                       "train.training.max_length=256", "train.lora.r=4"])
    recipes = train_recipes(config)
    assert {(r.training["max_length"], r.lora.r, r.data.system_message, r.run.effective_batch_size)
            for r in recipes.values()} == {(256, 4, "none", 8)}
    assert (config.evaluation.limit, config.evaluation.backend, config.curve_requests) == (20, "vllm", 20)
    with pytest.raises(RecipeValueError, match="unknown key training.max_lenght"):
        train_recipes(load_config(StudyConfig, ["recipe=study_smollm2", "train.training.max_lenght=3"]))
    with pytest.raises(ValueError, match="differ in training.max_length"):
        train_recipes(StudyConfig(train={}, objectives={"sft": "smollm2_prefix", "refusion": "smollm2_refusion_full"},
                                  eval={"benchmarks": ["humaneval"], "system_prompt": "none"}))


def same_logits(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Equal up to float32 rounding: within 1e-5 of the largest logit (the fp32 merge's own bound)."""
    return bool((first - second).abs().max() <= 1e-5 * first.abs().max())


def test_an_adapter_is_evaluated_merged_made_once(tmp_path, tiny_qwen3_dir):
    """The merge computes what the adapter does (same logits), is made once beside the adapter
    (a leftover partial merge is replaced; an adapter retrained at the same path is merged again),
    and merge_for_eval=false evaluates the adapter."""
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-20-merging").mkdir()  # a merge killed before its rename
    (tmp_path / "checkpoint-20-merging" / "stale.safetensors").write_text("half a file")
    config = StudyConfig(eval={"benchmarks": ["humaneval"], "system_prompt": "none"}, output_dir=str(tmp_path))
    merged = evaluated_model(config, adapter)
    assert merged == tmp_path / "checkpoint-20-merged" and not (tmp_path / "checkpoint-20-merging").exists()
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        through_lora = load_model(str(adapter), device="cpu").model(tokens).logits
        merged_logits = load_model(str(merged), device="cpu").model(tokens).logits
    assert same_logits(through_lora, merged_logits)
    assert not (merged / "stale.safetensors").exists()
    weights = (merged / "model.safetensors").stat().st_mtime_ns
    assert evaluated_model(config, adapter) == merged and (merged / "model.safetensors").stat().st_mtime_ns == weights
    make_adapter(tiny_qwen3_dir, adapter, seed=1)  # retrained at the same path
    assert evaluated_model(config, adapter) == merged and (merged / "model.safetensors").stat().st_mtime_ns != weights
    with torch.no_grad():
        retrained = load_model(str(adapter), device="cpu").model(tokens).logits
        assert same_logits(retrained, load_model(str(merged), device="cpu").model(tokens).logits)
    assert not same_logits(retrained, through_lora)
    unmerged = StudyConfig(eval={"benchmarks": ["humaneval"], "system_prompt": "none"}, merge_for_eval=False)
    assert evaluated_model(unmerged, adapter) == adapter


# The study of one objective on the embedded data, 2 problems, 2 steps: each stage's real code
# (data build, sweep and training launches, merge, before/after, curve, report) in minutes.
SMOKE_STUDY = ("objectives={'sft': 'smollm2_prefix'}, learning_rates=[1e-3], sweep_steps=1, max_steps=2, curve_points=2, "
               "data_recipe='embedded_prefix', threads=1, eval={'benchmarks': ['humaneval'], 'limit': 2, "
               "'backend': 'transformers', 'system_prompt': 'none', 'decode': {'max_new_tokens': 32}}")


@pytest.mark.slow
def test_the_study_runs_to_its_report_and_resumes_after_a_kill(tmp_path):
    """Killed (process group, as a preemption) once its sweep is done, the study reruns only
    what is missing: the sweep's adapter is not trained again; the report pairs the objective
    with the base, the curve has its three points, and the final adapter is evaluated merged."""
    out = tmp_path / "study"
    script = ("import sys; sys.path.insert(0, 'benchmarks')\n"
              "from study_adaptation import StudyConfig, run_study\n"
              f"run_study(StudyConfig({SMOKE_STUDY}, output_dir={str(out)!r}))\n")
    command, env = [sys.executable, "-c", script], launch_env()
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 900
        while not (out / "sweep.json").is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        with contextlib.suppress(ProcessLookupError):  # it may have ended (failed) on its own: its log says why
            os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert (out / "sweep.json").is_file(), (tmp_path / "first.log").read_text()[-3000:]
    swept = out / "sweep" / "sft-lr0.001" / "adapter" / "adapter_model.safetensors"
    trained_at = swept.stat().st_mtime_ns

    second = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    assert swept.stat().st_mtime_ns == trained_at
    study = (out / "study.md").read_text()
    assert "## Paired changes: humaneval, sft vs before" in study
    assert [point["step"] for point in json.loads((out / "curve.json").read_text())["sft"]] == [0, 1, 2]
    assert (out / "train" / "sft" / "adapter-merged" / "model.safetensors").is_file()
    assert f"adapted: {out / 'train' / 'sft' / 'adapter-merged'}" in (out / "report" / "config.yaml").read_text()
    # One system message, none here, for the training rows and every evaluated side.
    assert "system_prompt: none" in (out / "report" / "config.yaml").read_text()
    assert read_training_record(out / "train" / "sft" / "adapter")["system_message"] is None
