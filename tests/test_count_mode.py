"""Count mode (`timed_every` > 1): requests counted from batched greedy drafts of S_1..S_n,
without the batch-1 baselines and final update, get the records the step-by-step engine
executes, wall clock aside; identity is claimed only of what was compared (the timed
requests), and the drafter's agreement with the batch-1 baseline is measured on them."""

from __future__ import annotations

import json

import pytest
import torch

from eval.benchmarks import get_benchmark
from eval.engines.base import UpdateResult
from eval.engines.decode import DecodeSpec
from eval.engines.fast_path import Drafting, TransformersDrafter
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator, identity_fields
from eval.evaluation.runner import run_evaluation
from eval.reporting.metrics import identity, identity_phrase
from eval.reporting.tables import markdown_table
from headstart.files import read_jsonl
from headstart.models import load_model

# Every count a record carries, and what the answers and the drafts were.
COUNTED = ("base_answer", "stream_answer", "base_tokens", "stream_tokens", "draft_tokens", "accepted_tokens",
           "baseline_forwards", "residual_forwards", "drafting_forwards", "min_residual_forwards")
LOOKUP_COUNTED = ("lookup_baseline_forwards",)


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
        # Both of a counted record's answers are the drafter's D_n: nothing was compared, and it says so.
        assert record["identical"] is record["drafter_identical"] is None and record["identical_measured"] is False
        assert record.get("lookup_baseline_identical") is None
        assert executed["identical"] is True and executed["identical_measured"] is True
        assert record.get("lookup_baseline_seconds") is None
        if timed_record is not None:
            assert timed_record["engine"] == "fast" and timed_record["residual_seconds"] is not None
            assert timed_record["identical"] is timed_record["drafter_identical"] is True
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
    # Identity: claimed of the 3 timed requests, compared token for token; the drafter measured on them.
    assert [r["identical_measured"] for r in records] == timed
    assert (summary["identical_measured"], summary["counted"], summary["drafter_compared"]) == (3, 2, 3)
    assert summary["identical_to_baseline"] == summary["drafter_agreement"] == 1.0
    assert "100% of 3 compared; 2 counted, drafter agrees 100% of 3" in (tmp_path / "report.md").read_text()
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


def test_a_drafter_that_disagrees_with_the_baseline_is_measured_and_named(tiny_qwen3_dir, tiny_llama_dir, capsys):
    """Drafts decoded by another model (a drafter whose D_n is not the batch-1 baseline, as bf16 or
    vLLM batches can be): the streamed answer stays the baseline's (lossless), the timed requests
    record the disagreement, the summary's agreement falls, and each one is named in a warning."""
    loaded, other = load_model(str(tiny_qwen3_dir), device="cpu"), load_model(str(tiny_llama_dir), device="cpu")
    requests = get_benchmark("humaneval").load(limit=3)
    timed = evaluator(loaded, DecodeSpec(max_new_tokens=12))
    timed.drafter = TransformersDrafter(other.model, other.tokenizer.pad_token_id, timed.engine.eos_token_ids, 16)
    records = timed.evaluate_many(requests)
    assert all(r["identical"] is True and r["identical_measured"] for r in records)
    disagreeing = [r["request_id"] for r in records if r["drafter_identical"] is False]
    assert disagreeing, "the other model's answers equal this one's: the case is not exercised"
    warnings = capsys.readouterr().err
    assert all(f"request {request_id}: the drafter's answer to S_n differs" in warnings for request_id in disagreeing)
    summary = identity(records)
    assert summary["drafter_compared"] == 3 and summary["drafter_agreement"] == 1 - len(disagreeing) / 3


def test_results_computed_in_one_dtype_are_not_resumed_in_another(tiny_qwen3_dir, tmp_path):
    """dtype=null is the device's default: fp32 on this CPU, bf16 on a GPU (here: a model loaded in
    bf16 and handed over, as the device check does). The records say which; a resume must match."""
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=1, decode=DecodeSpec(max_new_tokens=4), output_dir=str(tmp_path))
    run_evaluation(config)
    assert read_jsonl(tmp_path / "results.jsonl")[0]["dtype"] == "float32"
    config.limit = 2
    in_bf16 = load_model(str(tiny_qwen3_dir), device="cpu", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="holds results computed in float32; this run computes in bfloat16"):
        run_evaluation(config, loaded=in_bf16)
    assert len(read_jsonl(tmp_path / "results.jsonl")) == 1


def test_identity_fields_say_what_was_compared_and_where_answers_part():
    timed = Drafting([[1]], 1, answer=[1, 2, 3])
    assert identity_fields(UpdateResult([1, 2, 3], 0, 0, 3, 0.1), UpdateResult([1, 2, 4], 1, 1, 2, 0.1), timed) == {
        "identical": False, "identical_measured": True, "first_difference": 2, "drafter_identical": True}
    counted = Drafting([[1]], 1, answer=[1, 2, 3], counted=True)
    assert identity_fields(UpdateResult([1, 2, 3], 0, 0, 3, None), UpdateResult([1, 2, 3], 1, 1, 2, None), counted) == {
        "identical": None, "identical_measured": False, "first_difference": None, "drafter_identical": None}
    records = [{"identical": False, "identical_measured": True, "first_difference": 2, "drafter_identical": True},
               {"identical": True, "identical_measured": True, "first_difference": None, "drafter_identical": False},
               {"identical": None, "identical_measured": False, "first_difference": None, "drafter_identical": None}]
    summary = identity(records)
    assert summary == {"identical_measured": 2, "counted": 1, "drafter_compared": 2, "identical_to_baseline": 0.5,
                       "first_difference_median": 2, "drafter_agreement": 0.5}
    assert identity_phrase(summary) == "50% of 2 compared; 1 counted, drafter agrees 50% of 2"
    # Records written before the fields existed: count mode's counted ones were never compared.
    assert identity([{"identical": True, "engine": "counted"}, {"identical": True, "engine": "fast"}])["identical_measured"] == 1


def test_a_count_mode_run_whose_drafter_disagrees_says_its_counts_are_not_exact(tiny_qwen3_dir, tiny_llama_dir, tmp_path,
                                                                                 monkeypatch, capsys):
    """Drafts by another real model (as a bf16 or vLLM drafter can depart from batch-1 greedy): the counted
    requests' counts rest on an agreement the timed ones measure, and the run ends saying so."""
    other = load_model(str(tiny_llama_dir), device="cpu")
    monkeypatch.setattr("eval.evaluation.evaluator.build_drafter",
                        lambda loaded, config, eos, needed_len=None: TransformersDrafter(
                            other.model, other.tokenizer.pad_token_id, eos, config.fast_batch_size))
    config = EvalConfig(model=str(tiny_qwen3_dir), limit=4, timed_every=2, decode=DecodeSpec(max_new_tokens=8),
                        output_dir=str(tmp_path))
    summary = run_evaluation(config)
    assert summary["counted"] == 2 and summary["drafter_compared"] == 2 and summary["drafter_agreement"] < 1
    assert "the 2 counted requests rest on that agreement, so their counts are not exact" in capsys.readouterr().err


def test_the_warm_up_runs_a_prefill_and_a_one_token_step_uncounted(tiny_qwen3_dir):
    """Wall clock is measured on a warm model: the kernels of a one-token step, not only a prefill's,
    have run before the first timed baseline; no forward of it is counted."""
    loaded = load_model(str(tiny_qwen3_dir), device="cpu")
    timed = evaluator(loaded, DecodeSpec(max_new_tokens=4))
    widths = []
    hook = loaded.model.register_forward_pre_hook(lambda _m, _a, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                                  with_kwargs=True)
    try:
        request = get_benchmark("humaneval").load(limit=1)[0]
        timed.warm_up(request)
    finally:
        hook.remove()
    assert widths == [len(timed.prompts(request)[-1]), 1] and not timed.engine.forwards
