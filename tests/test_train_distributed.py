"""Two CPU processes (gloo): DDP, DeepSpeed ZeRO-2 and ZeRO-3 train to the same losses."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import humaneval_dialogues, launch, step_losses, tiny_overrides, write_jsonl

from headstart.models import load_model

# On CPU, `--multi_gpu` makes DDP over gloo; with a DeepSpeed config it must be left
# out (it would override DeepSpeed), and train/sft.py names the gloo backend itself.
LAUNCHERS = {
    "ddp": ["--multi_gpu", "--num_processes", "2"],
    "zero2": ["--config_file", "headstart/recipes/accelerate/zero2.yaml", "--num_processes", "2"],
    "zero3": ["--config_file", "headstart/recipes/accelerate/zero3.yaml", "--num_processes", "2"],
}


@pytest.mark.slow
def test_ddp_zero2_zero3_give_the_same_loss(tmp_path, tiny_qwen3_dir):
    data = write_jsonl(tmp_path / "data.jsonl", humaneval_dialogues(32))
    losses, adapters = {}, {}
    for name, launcher in LAUNCHERS.items():
        out = tmp_path / name
        # ZeRO-3 also merges: the adapter must come out gathered from both shards.
        overrides = tiny_overrides(tiny_qwen3_dir, data, out, max_steps=4, save_steps=4, merge=str(name == "zero3").lower())
        result = launch(launcher, overrides, timeout=400)
        expected_type = "DEEPSPEED" if name.startswith("zero") else "MULTI_CPU"
        assert f"processes: 2 ({expected_type}), gradient accumulation: 1" in result.stdout
        losses[name] = step_losses(out)
        adapters[name] = load_file(out / "adapter" / "adapter_model.safetensors")

    assert sorted(losses["ddp"]) == [1, 2, 3, 4]
    for name in ("zero2", "zero3"):
        assert losses[name].keys() == losses["ddp"].keys()
        for step, loss in losses["ddp"].items():
            assert losses[name][step] == pytest.approx(loss, rel=1e-4), (name, step)
        assert adapters[name].keys() == adapters["ddp"].keys()
        for key, weight in adapters["ddp"].items():
            torch.testing.assert_close(adapters[name][key], weight, rtol=1e-3, atol=1e-4)

    merged = load_model(str(tmp_path / "zero3" / "merged"), device="cpu").model
    assert not any(p.numel() == 0 for p in merged.parameters()), "ZeRO-3 saved empty (unGathered) weights"
