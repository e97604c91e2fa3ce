"""Sharded evaluation (eval.evaluation.shards): shards hold disjoint requests, and merged they make
the very results and report of the unsharded run. Wall-clock seconds differ between any
two runs, sharded or not, so every comparison leaves out the timing fields (records'
*_seconds, summaries' *wall* speedups, the report's wall columns) and only those."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_before_after import make_adapter

from eval.__main__ import main
from eval.before_after import BeforeAfterConfig, run_before_after
from eval.engines.decode import DecodeSpec
from eval.evaluation import runner, suite
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from eval.evaluation.suite import run_suite
from headstart.config import load_config
from headstart.files import read_jsonl
from headstart.models import load_model

TIMING = re.compile(r"_seconds$|wall")


def untimed(value):
    """`value` without its wall-clock figures (keys ending in _seconds or naming wall)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not TIMING.search(k)}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def untimed_markdown(text: str) -> str:
    """A Markdown report with the cells of its wall-clock columns and rows blanked."""
    lines, wall, header_next = [], set(), True
    for line in text.splitlines():
        if not line.startswith("|"):
            header_next = True
            lines.append(line)
            continue
        cells = line.split("|")
        if header_next:
            wall, header_next = {i for i, cell in enumerate(cells) if "wall" in cell}, False
        row_is_wall = len(cells) > 2 and "wall" in cells[1]  # the paired changes' "median speedup (wall clock)"
        lines.append("|".join("(wall)" if i in wall or (row_is_wall and i > 1) else cell for i, cell in enumerate(cells)))
    return "\n".join(lines)


def assert_same_results(sharded: Path, unsharded: Path) -> None:
    """One results directory equals the other but for timing: every record (in order),
    the settings, the summary and the report."""
    records = read_jsonl(sharded / "results.jsonl")
    assert [r["request_id"] for r in records] == [r["request_id"] for r in read_jsonl(unsharded / "results.jsonl")]
    assert untimed(records) == untimed(read_jsonl(unsharded / "results.jsonl"))
    assert (sharded / "config.json").read_text() == (unsharded / "config.json").read_text()
    # config.yaml names its output_dir, the one setting the two runs must not share.
    assert (sharded / "config.yaml").read_text() == (unsharded / "config.yaml").read_text().replace(
        str(unsharded), str(sharded))
    assert untimed(json.loads((sharded / "summary.json").read_text())) == untimed(
        json.loads((unsharded / "summary.json").read_text()))
    assert untimed_markdown((sharded / "report.md").read_text()) == untimed_markdown((unsharded / "report.md").read_text())


def shard_ids(directory: Path) -> list[str]:
    return [r["request_id"] for r in read_jsonl(directory / "results.jsonl")]


def test_sharded_before_after_merges_into_the_unsharded_report(tmp_path, tiny_qwen3_dir, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    adapter = make_adapter(tiny_qwen3_dir, tmp_path / "adapter")
    # 5 requests over 2 shards: uneven shards, and the merge must interleave them back.
    config = BeforeAfterConfig(model=str(tiny_qwen3_dir), adapted=str(adapter), limit=5,
                               decode=DecodeSpec(max_new_tokens=8), output_dir=str(tmp_path / "whole"))
    run_before_after(config)
    sharded = replace(config, output_dir=str(tmp_path / "sharded"))
    for index in range(2):
        run_before_after(replace(sharded, shard=f"{index}/2"))
    out = tmp_path / "sharded"
    # Shards write only under shards/ (so they never share a file) and no report.
    assert not (out / "report.md").exists() and not (out / "config.yaml").exists() and not (out / "wandb").exists()
    for side in ("before", "after"):
        assert not (out / side / "humaneval" / "results.jsonl").exists()
        parts = [shard_ids(out / side / "humaneval" / "shards" / f"{i}-of-2") for i in range(2)]
        whole = shard_ids(tmp_path / "whole" / side / "humaneval")
        assert parts == [whole[0::2], whole[1::2]] and len(parts[0]) == 3 and len(parts[1]) == 2
    with monkeypatch.context() as patch:  # the merge computes nothing: no model loads
        patch.setattr(runner, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
        run_before_after(sharded)
    for side in ("before", "after"):
        assert_same_results(out / side / "humaneval", tmp_path / "whole" / side / "humaneval")
    assert untimed(json.loads((out / "summary.json").read_text())) == untimed(
        json.loads((tmp_path / "whole" / "summary.json").read_text()))
    assert untimed_markdown((out / "report.md").read_text()) == untimed_markdown(
        (tmp_path / "whole" / "report.md").read_text().replace(str(tmp_path / "whole"), str(out)))
    assert (out / "config.yaml").read_text() == (tmp_path / "whole" / "config.yaml").read_text().replace(
        str(tmp_path / "whole"), str(out))
    assert len(sorted((out / "wandb").glob("offline-run-*"))) == 2
    # Merging again changes nothing.
    merged = (out / "after" / "humaneval" / "results.jsonl").read_text()
    run_before_after(sharded)
    assert (out / "after" / "humaneval" / "results.jsonl").read_text() == merged


def test_sharded_suite_merges_into_the_unsharded_suite(tmp_path, tiny_qwen3_dir, monkeypatch):
    config = load_config(EvalConfig, ["recipe=suite_smollm2", f"model={tiny_qwen3_dir}", "limit=3",
                                      "decode.max_new_tokens=4", "acceptances=[greedy]"])
    config = replace(config, benchmarks=["humaneval", "coedit"],
                     data_paths={k: v for k, v in config.data_paths.items() if k == "coedit"})
    run_suite(replace(config, output_dir=str(tmp_path / "whole")))
    sharded = replace(config, output_dir=str(tmp_path / "sharded"))
    for index in range(3):
        run_suite(replace(sharded, shard=f"{index}/3"))
    assert not (tmp_path / "sharded" / "report.md").exists()
    monkeypatch.setattr(suite, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    run_suite(sharded)  # the merge
    for benchmark in ("humaneval", "coedit"):
        assert_same_results(tmp_path / "sharded" / benchmark / "greedy", tmp_path / "whole" / benchmark / "greedy")
    assert untimed_markdown((tmp_path / "sharded" / "report.md").read_text()) == untimed_markdown(
        (tmp_path / "whole" / "report.md").read_text())


@pytest.mark.parametrize("text, problem", [("1", "not INDEX/COUNT"), ("a/b", "not INDEX/COUNT"), ("-1/2", "not INDEX/COUNT"),
                                           ("2/2", "INDEX must be 0..COUNT-1"), ("0/0", "COUNT at least 1")])
def test_bad_shard_strings_are_refused_naming_the_form(text, problem):
    with pytest.raises(ValueError, match=problem):
        EvalConfig(shard=text)
    with pytest.raises(ValueError, match=problem):
        BeforeAfterConfig(shard=text)


def test_a_bad_shard_on_the_command_line_ends_with_its_message(capsys):
    assert main(["shard=3/2"]) == 2
    assert "shard '3/2'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="report_only"):
        EvalConfig(shard="0/2", report_only=True)


def test_the_merge_refuses_missing_unfinished_and_mismatched_shards(tmp_path, tiny_qwen3_dir):
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=3, decode=DecodeSpec(max_new_tokens=4), output_dir=str(tmp_path))
    shards = tmp_path / "shards"
    run_evaluation(replace(config, shard="0/2"))
    with pytest.raises(ValueError, match=r"shard 1/2 missing \(of 2\)"):
        run_evaluation(config)
    run_evaluation(replace(config, shard="1/2"))
    # A shard cut short (its job killed) is unfinished, and named.
    results = shards / "0-of-2" / "results.jsonl"
    finished = results.read_text()
    results.write_text(finished.splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match=r"0-of-2: shard 0/2 unfinished \(1 of 2 requests done\); rerun it with shard=0/2"):
        run_evaluation(config)
    results.write_text(finished)
    # Other settings (here the answer length) or another selection (limit) do not merge.
    with pytest.raises(ValueError, match=r"shard 0/2 ran with other settings \(max_new_tokens: 4 \(shard\) vs 5"):
        run_evaluation(replace(config, decode=DecodeSpec(max_new_tokens=5), output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="shard 0/2 was given 2 other requests than the 3 this run assigns it"):
        run_evaluation(replace(config, limit=5))
    # Shards of another COUNT beside them.
    run_evaluation(replace(config, shard="0/3"))
    with pytest.raises(ValueError, match="shards of 2 and 3 shards"):
        run_evaluation(config)
    assert not (tmp_path / "results.jsonl").exists() and not (tmp_path / "report.md").exists()
    (shards / "0-of-3" / "results.jsonl").unlink()
    for name in ("config.json", "config.yaml", "shard.json", "summary.json", "report.md", "headstart-run.json"):
        (shards / "0-of-3" / name).unlink()
    (shards / "0-of-3").rmdir()
    summary = run_evaluation(config)
    assert summary["requests"] == 3 and len(read_jsonl(tmp_path / "results.jsonl")) == 3


def test_more_shards_than_requests_leave_empty_shards_that_merge(tmp_path, tiny_qwen3_dir):
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=2, decode=DecodeSpec(max_new_tokens=4), output_dir=str(tmp_path))
    for index in range(3):
        run_evaluation(replace(config, shard=f"{index}/3"))
    assert read_jsonl(tmp_path / "shards" / "2-of-3" / "results.jsonl") == []
    assert run_evaluation(config)["requests"] == 2


def test_the_merge_refuses_shards_computed_in_different_dtypes(tmp_path, tiny_qwen3_dir):
    """dtype=null resolves per device: a shard on a GPU (bf16; here a model loaded in bf16 and handed
    over) and one on a CPU (fp32) hold other numbers; the merge names both."""
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=2, decode=DecodeSpec(max_new_tokens=4), output_dir=str(tmp_path))
    run_evaluation(replace(config, shard="0/2"))
    run_evaluation(replace(config, shard="1/2"), loaded=load_model(str(tiny_qwen3_dir), device="cpu", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"different dtypes \(float32 \(shard 0/2\), bfloat16 \(shard 1/2\)\)"):
        run_evaluation(config)
