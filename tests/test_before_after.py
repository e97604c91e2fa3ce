"""The before/after report on tiny models: both sides, tables, figures, W&B, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from wandb_log import logged_by_runs

from eval.before_after import BeforeAfterConfig, main, run_before_after, side_config
from eval.engines.decode import DecodeSpec
from headstart.config import load_config
from headstart.models import load_model
from headstart.paths import RECIPES_DIR


def make_adapter(base_dir: Path, target: Path, seed: int = 0) -> Path:
    """A LoRA adapter with non-zero weights, so the adapted model really differs."""
    model = load_model(str(base_dir), device="cpu").model
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.5)
    peft_model.save_pretrained(target)
    return target


def test_before_after_writes_tables_figures_and_wandb_runs_and_reuses_results(tmp_path, tiny_qwen3_dir, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "adapter")
    config = BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(adapter), limit=2, decode=DecodeSpec(max_new_tokens=12),
                               output_dir=str(tmp_path / "report"))
    summaries = run_before_after(config)
    out = tmp_path / "report"
    assert set(summaries["humaneval"]) == {"before", "after"}
    before = (out / "before" / "humaneval" / "results.jsonl").read_text().splitlines()
    after = (out / "after" / "humaneval" / "results.jsonl").read_text().splitlines()
    assert len(before) == len(after) == 2
    assert [json.loads(a)["base_answer"] for a in after] != [json.loads(b)["base_answer"] for b in before]
    report = (out / "report.md").read_text()
    for title in ("Table 1", "Table 2", "Table 3"):
        assert title in report
    assert "→" in report and "figures/speedup_humaneval.png" in report
    assert (out / "report.html").read_text().count("<table>") == 4  # Tables 1-3 and the paired changes
    assert (out / "figures" / "speedup_humaneval.png").stat().st_size > 1000
    assert (out / "figures" / "acceptance.png").stat().st_size > 1000
    # Paired over the same requests: every change with its interval and verdict, the tests, the figure.
    assert "## Paired changes: humaneval, after vs before" in report and "figures/paired_differences.png" in report
    assert "| median residual forwards |" in report and "Wilcoxon signed-rank p = " in report
    assert (out / "figures" / "paired_differences.png").stat().st_size > 1000
    summary = json.loads((out / "summary.json").read_text())["humaneval"]
    paired = summary["after"]["paired_vs_before"]
    assert "paired_vs_before" not in summary["before"] and paired["requests"] == 2
    assert paired["lower"] + paired["equal"] + paired["higher"] == 2
    assert set(paired["differences"]) == {"HumanEval/0", "HumanEval/1"}
    change = paired["changes"]["forwards_stream_median"]
    assert change["low"] <= change["estimate"] <= change["high"]
    assert change["verdict"] in ("lower", "higher", "no measurable change")
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2
    key = b"humaneval/paired/forwards_stream_median/change"
    logged = logged_by_runs(runs, key)  # offline: each run's .wandb log
    assert sum(key in log for log in logged) == 1  # the after side's
    # A rerun computes nothing new: the per-request results are reused as they are.
    run_before_after(config)
    assert (out / "before" / "humaneval" / "results.jsonl").read_text().splitlines() == before


def test_before_after_recipe_validates():
    for path in sorted((RECIPES_DIR / "before_after").rglob("*.yaml")):
        assert isinstance(load_config(BeforeAfterConfig, [f"recipe={path}"]), BeforeAfterConfig)


def test_both_sides_get_the_drafting_and_timing_settings():
    config = BeforeAfterConfig(model="base", adapted="adapter", more_adapted={"sdft": "other"}, backend="vllm",
                               fast_batch_size=256, timed_every=20)
    for side in config.sides:
        evaluation = side_config(config, side, "humaneval")
        assert (evaluation.backend, evaluation.fast_batch_size, evaluation.timed_every) == ("vllm", 256, 20), side
    with pytest.raises(ValueError, match="timed_every=20 counts requests from greedy drafts"):
        BeforeAfterConfig(timed_every=20, decode=DecodeSpec(acceptance="threshold:0.9"))


def test_before_after_refuses_a_retrained_adapter_at_the_same_path(tmp_path, tiny_qwen3_dir, monkeypatch):
    """A rerun with another adapter at the same path used to reuse the old 'after'
    results; the weights' fingerprint refuses them, before anything is evaluated."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "adapter")
    config = BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(adapter), limit=1, decode=DecodeSpec(max_new_tokens=4),
                               output_dir=str(tmp_path / "report"))
    run_before_after(config)
    before = (tmp_path / "report" / "before" / "humaneval" / "results.jsonl").read_text()
    make_adapter(tiny_qwen3_dir, adapter, seed=1)  # retrained: same path, other weights
    with pytest.raises(ValueError, match="weights_fingerprint"):
        run_before_after(config)
    assert (tmp_path / "report" / "before" / "humaneval" / "results.jsonl").read_text() == before


def test_before_after_checks_both_sides_before_evaluating_either(tmp_path, tiny_qwen3_dir, monkeypatch, capsys):
    """A missing adapted model used to fail only after the whole 'before' side ran."""
    import eval.evaluation.runner

    monkeypatch.setattr(eval.evaluation.runner, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "report"
    common = [f"model={tiny_qwen3_dir}", f"output_dir={out}", "decode.max_new_tokens=4"]
    assert main([*common, f"adapted={tmp_path / 'no_adapter'}"]) == 2
    assert "not found" in capsys.readouterr().err and not out.exists()
    assert main([*common, f"adapted={tiny_qwen3_dir}", "limit=-2"]) == 2
    assert "limit must be" in capsys.readouterr().err and not out.exists()
    assert main([*common, f"adapted={tiny_qwen3_dir}", "limit=0"]) == 0  # check only
    assert "limit=0" in capsys.readouterr().out and not out.exists()


def test_a_third_side_is_evaluated_reported_and_logged_like_the_others(tmp_path, tiny_qwen3_dir, monkeypatch):
    """base, sft and distill in one report: each side's results equal its own evaluation."""
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    sft = make_adapter(tiny_qwen3_dir, tmp_path / "sft", seed=0)
    distill = make_adapter(tiny_qwen3_dir, tmp_path / "distill", seed=1)
    out = tmp_path / "report"
    assert main([f"model={tiny_qwen3_dir}", f"adapted={sft}", f"more_adapted={{distill: {distill}}}", "limit=2",
                 "decode.max_new_tokens=8", f"output_dir={out}"]) == 0
    answers = {side: [json.loads(line)["base_answer"] for line in (out / side / "humaneval" / "results.jsonl").open()]
               for side in ("before", "after", "distill")}
    assert answers["distill"] != answers["after"] and answers["distill"] != answers["before"]
    summary = json.loads((out / "summary.json").read_text())["humaneval"]
    assert list(summary) == ["before", "after", "distill"]
    report = (out / "report.md").read_text()
    assert "Table 3: acceptance (before → after → distill)" in report and f"distill `{distill}`" in report
    for side in ("after", "distill"):
        assert f"## Paired changes: humaneval, {side} vs before" in report
    table2_row = next(line for line in report.splitlines() if line.startswith("| humaneval") and "x →" in line)
    assert table2_row.count("→") == 2 * 6  # each of Table 2's six cells holds three sides
    assert len(sorted((out / "wandb").glob("offline-run-*"))) == 3


def test_more_adapted_side_names_are_checked():
    with pytest.raises(ValueError, match="side name 'after'"):
        BeforeAfterConfig(more_adapted={"after": "x"})
    with pytest.raises(ValueError, match="side name 'a/b'"):
        BeforeAfterConfig(more_adapted={"a/b": "x"})


def test_every_side_gets_the_system_message_the_adapted_model_was_trained_with(tmp_path):
    """`system_prompt=model` (the shared default) reads the adapted model's training record and gives
    it to every side, the base included; a named setting is given as it is."""
    from eval.before_after import shared_system_setting
    from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, write_training_record

    def sides(record: dict | None, **settings) -> set[str]:
        adapted = tmp_path / f"adapter{len(list(tmp_path.iterdir()))}"
        adapted.mkdir()
        if record is not None:
            write_training_record(adapted, record)
        config = BeforeAfterConfig(adapted=str(adapted), **settings)
        return {side_config(config, side, "humaneval").system_prompt for side in config.sides}

    assert sides({"system_message": INCOMPLETE_REQUEST_SYSTEM}) == {"incomplete"}
    assert sides({"system_message": None}) == sides(None) == {"none"}
    assert sides({"system_message": "Be brief."}) == {"Be brief."}
    assert sides({"system_message": None}, system_prompt="incomplete") == {"incomplete"}
    assert shared_system_setting(BeforeAfterConfig(system_prompt="Be kind.")) == "Be kind."
