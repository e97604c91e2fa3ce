"""Count mode (`timed_every` > 1): requests counted from batched greedy drafts of S_1..S_n,
without the batch-1 baselines and final update, get the records the step-by-step engine
executes, wall clock aside."""

from __future__ import annotations

import json

import pytest

from eval.benchmarks import get_benchmark
from eval.config import EvalConfig
from eval.engines.decode import DecodeSpec
from eval.evaluator import StreamingEvaluator
from eval.reporting.tables import markdown_table
from eval.runner import run_evaluation
from headstart.files import read_jsonl
from headstart.models import load_model

# Every count a record carries, and what the answers and the drafts were.
COUNTED = ("base_answer", "stream_answer", "base_tokens", "stream_tokens", "draft_tokens", "accepted_tokens", "identical",
           "baseline_forwards", "residual_forwards", "drafting_forwards", "min_residual_forwards")
LOOKUP_COUNTED = ("lookup_baseline_forwards", "lookup_baseline_identical")


def evaluator(loaded, decode: DecodeSpec, counted_ids=frozenset(), **config) -> StreamingEvaluator:
    return StreamingEvaluator(loaded, EvalConfig(model="unused", decode=decode, **config), untimed=counted_ids)


def compare_with_stepwise(loaded, requests, regenerate: str, max_new_tokens: int, batch_size: int,
                          timed_too: bool = False) -> list[dict]:
    """Counted records == the step-by-step engine's; `timed_too`: the timed fast path's as well
    (the step-by-step run, the expensive part, is shared)."""
    decode = DecodeSpec(max_new_tokens=max_new_tokens, regenerate=regenerate)
    stepwise = evaluator(loaded, DecodeSpec(max_new_tokens=max_new_tokens, regenerate=regenerate, engine="stepwise"))
    counting = evaluator(loaded, decode, frozenset(r.request_id for r in requests), fast_batch_size=batch_size)
    groups = counting.request_groups(requests)
    assert len(groups) > 1, "several padded batches: the case of a real run"
    counted = [record for group in groups for record in counting.evaluate_many(group)]
    timed = evaluator(loaded, decode).evaluate_many(requests) if timed_too else [None] * len(requests)
    keys = COUNTED + (LOOKUP_COUNTED if regenerate == "lookup" else ())
    for request, record, timed_record in zip(requests, counted, timed):
        executed = stepwise.evaluate(request)
        assert {k: record[k] for k in keys} == {k: executed[k] for k in keys}, request.request_id
        assert record["engine"] == "counted" and record["baseline_seconds"] is record["residual_seconds"] is None
        assert record.get("lookup_baseline_seconds") is None
        if timed_record is not None:
            assert timed_record["engine"] == "fast" and timed_record["residual_seconds"] is not None
            assert {k: timed_record[k] for k in keys} == {k: executed[k] for k in keys}, request.request_id
    return counted


@pytest.mark.parametrize("regenerate", ["plain", "lookup"])
def test_counted_records_equal_the_step_by_step_engines(tiny_model_dir, regenerate):
    requests = get_benchmark("humaneval").load(limit=6)
    counted = compare_with_stepwise(load_model(str(tiny_model_dir), device="cpu"), requests, regenerate, 24, 12,
                                    timed_too=True)
    assert any(0 < r["accepted_tokens"] for r in counted), "no draft was even partly kept: the case is not exercised"


@pytest.mark.slow
def test_smollm2_counted_records_equal_the_step_by_step_engines():
    """The real model on a HumanEval and an MBPP request, 32 tokens, under lookup regeneration
    (plain regeneration, and the timed fast path beside the counted records: on the tiny models
    above; the fast path on SmolLM2 under a threshold rule in tests/test_lookup.py)."""
    loaded = load_model("smollm2", device="cpu")
    requests = get_benchmark("humaneval").load(limit=4)[3:] + get_benchmark("mbpp", "data/mbpp/mbpp.jsonl").load(limit=1)
    counted = compare_with_stepwise(loaded, requests, "lookup", 32, 4)
    assert any(r["residual_forwards"] < r["baseline_forwards"] for r in counted)
    assert any(0 < r["accepted_tokens"] < r["draft_tokens"] for r in counted), "no draft kept in part"


def test_a_count_mode_run_times_every_nth_request_and_reports_wall_clock_over_those(tiny_qwen3_dir, tmp_path):
    decode = DecodeSpec(max_new_tokens=8)
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=5, timed_every=2, decode=decode, output_dir=str(tmp_path))
    summary = run_evaluation(config)
    records = read_jsonl(tmp_path / "results.jsonl")
    timed = [r["baseline_seconds"] is not None for r in records]
    assert timed == [True, False, True, False, True]  # positions 0, 2, 4 of the selection
    assert [r["engine"] for r in records] == ["fast", "counted", "fast", "counted", "fast"]
    assert summary["timed"] == 3 and summary["evaluated"] == 5 and summary["speedup_wall_median"] > 0
    assert json.loads((tmp_path / "config.json").read_text())["timed_every"] == 2
    assert "Count mode: every 2th request timed" in (tmp_path / "report.md").read_text()
    # Another sample in the same directory would mix two: refused.
    with pytest.raises(ValueError, match="timed_every: 2 -> 3"):
        run_evaluation(EvalConfig(model=str(tiny_qwen3_dir), limit=5, timed_every=3, decode=decode, output_dir=str(tmp_path)))


def test_a_shard_with_nothing_timed_reports_no_wall_clock(tiny_qwen3_dir, tmp_path):
    """Shard 1/2 of a run timing every 2nd request holds only untimed ones: its table shows no wall clock."""
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=4, timed_every=2, shard="1/2", decode=DecodeSpec(max_new_tokens=6),
                        output_dir=str(tmp_path))
    summary = run_evaluation(config)
    assert summary["timed"] == 0 and summary["evaluated"] == 2
    assert not any(key.startswith("speedup_wall") or key.endswith("_wall") for key in summary)
    table = markdown_table({"humaneval": summary})
    row = dict(zip(*(line.strip("|").split(" | ") for line in (table.splitlines()[0], table.splitlines()[2]))))
    assert row["speedup wall med"].strip() == "-" and row["<1x fwd/wall"].strip().endswith("/-")


@pytest.mark.parametrize("settings", [dict(acceptance="threshold:0.5"), dict(engine="stepwise")])
def test_count_mode_needs_greedy_on_the_fast_path(settings):
    with pytest.raises(ValueError, match="timed_every=4 counts requests from greedy drafts"):
        EvalConfig(timed_every=4, decode=DecodeSpec(**settings))
    with pytest.raises(ValueError, match="timed_every must be >= 1"):
        EvalConfig(timed_every=0)
