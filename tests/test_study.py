"""The adaptation study's settings and stages (benchmarks/study_adaptation.py): checkpoint
spacing, refusals, and the merged models its evaluations load."""

from __future__ import annotations

import pytest
import torch
from study_adaptation import StudyConfig, evaluated_model
from test_before_after import make_adapter

from headstart.config import load_config
from headstart.models import load_model


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
                                              (["objective_steps={refusion: 5}"], "not objectives of the study")])
def test_bad_study_settings_are_refused_before_any_work(bad, message):
    with pytest.raises(ValueError, match=message):
        load_config(StudyConfig, ["recipe=study_smollm2", *bad])


def test_an_adapter_is_evaluated_merged_made_once(tmp_path, tiny_qwen3_dir):
    """The merge computes what the adapter does (same logits), is made once beside the adapter
    (a leftover partial merge is replaced), and merge_for_eval=false evaluates the adapter."""
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-20-merging").mkdir()  # a merge killed before its rename
    config = StudyConfig(benchmarks=["humaneval"], output_dir=str(tmp_path))
    merged = evaluated_model(config, adapter)
    assert merged == tmp_path / "checkpoint-20-merged" and not (tmp_path / "checkpoint-20-merging").exists()
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        through_lora = load_model(str(adapter), device="cpu").model(tokens).logits
        merged_logits = load_model(str(merged), device="cpu").model(tokens).logits
    assert torch.allclose(through_lora, merged_logits, atol=1e-5)
    weights = next(merged.glob("*.safetensors")).stat().st_mtime_ns
    assert evaluated_model(config, adapter) == merged and next(merged.glob("*.safetensors")).stat().st_mtime_ns == weights
    assert evaluated_model(StudyConfig(benchmarks=["humaneval"], merge_for_eval=False), adapter) == adapter
