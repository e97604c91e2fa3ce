"""Metrics on hand-worked cases, answer extraction, the suite report layout,
and the suite run end to end on a tiny model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eval.benchmarks.extract import ds1000_postprocess, extract_text
from eval.evaluation.config import EvalConfig
from eval.evaluation.suite import report_finished, run_suite
from eval.reporting.metrics import normalize_text, summarize, token_f1
from eval.reporting.tables import macro_average, quality_table, suite_report
from headstart.config import load_config
from headstart.files import read_jsonl


def record(base_score: float, stream_score: float, status: str = "passed", base: str = "a b", stream: str = "a b") -> dict:
    return {"request_id": "r", "base_answer": base, "stream_answer": stream, "base_score": base_score,
            "stream_score": stream_score, "base_status": status, "stream_status": status,
            "baseline_forwards": 10, "residual_forwards": 5, "baseline_seconds": 1.0, "residual_seconds": 0.5,
            "draft_tokens": 10, "accepted_tokens": 5, "drafting_forwards": 20, "identical": base == stream}


def test_token_f1_hand_worked():
    assert normalize_text("The  Cat, sat!") == "cat sat"
    # "cat sat on mat" vs "cat sat on hat": 3 common of 4 and 4 -> P = R = 0.75.
    assert token_f1("the cat sat on the mat", "a cat sat on a hat") == pytest.approx(0.75)
    # "x x y" vs "x y z": 2 common (x once, y); P = 2/3, R = 2/3.
    assert token_f1("x x y", "x y z") == pytest.approx(2 / 3)
    # "a b" vs "a b c d": P = 1, R = 1/2 -> F1 = 2/3.
    assert token_f1("alpha beta", "alpha beta gamma delta") == pytest.approx(2 / 3)
    assert token_f1("", "") == 1.0 and token_f1("the", "word") == 0.0 and token_f1("zz", "yy") == 0.0


def test_the_floor_bound_reads_a_speedup_against_the_least_residual_cost():
    """ReFusion records (floor 3): baselines 12, 16, 30 over residuals 3, 4, 5 -> speedups 4, 4, 6
    (median 4); bounds 4, 5.33, 10 (median 5.33); share 4 / 5.33 = 75%. AR records (no field): floor 1."""
    records = [record(1, 1) | {"baseline_forwards": b, "residual_forwards": r, "min_residual_forwards": 3}
               for b, r in ((12, 3), (16, 4), (30, 5))]
    summary = summarize(records)
    assert summary["residual_floor"] == 3 and summary["minimum_cost_share"] == pytest.approx(1 / 3)
    assert summary["floor_bound_median"] == pytest.approx(16 / 3)
    assert summary["floor_bound_share"] == pytest.approx(0.75)
    assert "tokens_per_forward_base" not in summary  # records without base_tokens
    with_tokens = summarize([r | {"base_tokens": t} for r, t in zip(records, (24, 40, 30))])
    assert with_tokens["tokens_per_forward_base"] == pytest.approx(94 / 58)
    ar = summarize([record(1, 1)])  # 10 forwards over 5: 2x of a 10x bound
    assert (ar["residual_floor"], ar["floor_bound_median"], ar["floor_bound_share"]) == (1, 10, pytest.approx(0.2))


def test_summary_leaves_skipped_problems_out_of_quality_and_counts_them():
    records = [record(1.0, 1.0), record(0.0, 1.0), record(0.0, 0.0, status="skipped: tensorflow not installed")]
    summary = summarize(records)
    assert summary["skipped"] == 1 and summary["quality_evaluated"] == 2 and summary["evaluated"] == 3
    assert summary["quality_base"] == 0.5 and summary["quality_stream"] == 1.0


def test_agreement_f1_compares_the_streamed_answer_with_the_base_answer():
    summary = summarize([record(1, 1, base="x y", stream="x y"),
                         record(1, 1, base="alpha beta gamma delta", stream="alpha beta")])
    assert summary["agreement_f1"] == pytest.approx((1 + 2 / 3) / 2)


def test_macro_average_is_unweighted_and_sums_counts():
    macro = macro_average({"a": {"evaluated": 10, "quality_base": 0.2, "speedup_forwards_median": 2.0},
                           "b": {"evaluated": 30, "quality_base": 0.6}})
    assert macro == {"evaluated": 40, "quality_base": pytest.approx(0.4), "speedup_forwards_median": 2.0}


def test_quality_table_has_one_row_per_benchmark_and_the_delta():
    table = quality_table({"mbpp": {"evaluated": 2, "quality_base": 0.5, "quality_stream": 0.25}}, {"mbpp": "pass@1"})
    assert "| mbpp | pass@1 | 2 | - | 50.0% | 25.0% | -25.0% |" in table


def test_extraction_follows_the_official_ds1000_postprocessing():
    assert ds1000_postprocess("result = 1\n</code>\nEND SOLUTION") == "result = 1\n"
    assert ds1000_postprocess("<code>result = 2\nEND SOLUTION\nmore") == "result = 2"
    assert ds1000_postprocess("Use this:\n```python\nresult = 3\n```\nDone.") == "result = 3\n"
    assert extract_text("Here is the edited text:\n\n\"It works.\"") == "It works."
    assert extract_text("It works: really.") == "It works: really."


def test_the_suite_runs_every_benchmark_and_writes_one_report(tiny_qwen3_dir, tmp_path):
    config = load_config(EvalConfig, ["recipe=suite_smollm2", f"model={tiny_qwen3_dir}", "limit=1",
                                      "decode.max_new_tokens=4", f"output_dir={tmp_path}", "acceptances=[greedy]"])
    by_rule = run_suite(config)
    assert list(by_rule["greedy"]) == ["humaneval", "mbpp", "canitedit", "ds1000", "coedit", "chat"]
    report = (tmp_path / "report.md").read_text()
    assert report.count("| macro average |") == 2 and "Table 1" in report and "Table 2" in report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["greedy"]["macro average"]["requests"] == 6
    # A rerun resumes: every benchmark's result is read back, nothing is recomputed.
    lines = (tmp_path / "chat" / "greedy" / "results.jsonl").read_text()
    run_suite(config)
    assert (tmp_path / "chat" / "greedy" / "results.jsonl").read_text() == lines


def test_the_report_of_a_suite_in_progress_compares_rules_on_the_same_requests(tiny_qwen3_dir, tmp_path):
    config = load_config(EvalConfig, ["recipe=suite_smollm2", f"model={tiny_qwen3_dir}", "limit=2", "decode.max_new_tokens=4",
                                      f"output_dir={tmp_path}"])
    config = replace(config, benchmarks=["coedit", "chat"],
                     data_paths={k: v for k, v in config.data_paths.items() if k in ("coedit", "chat")})
    run_suite(config)
    # The threshold run of CoEdIT is cut short after its first request.
    cut = tmp_path / "coedit" / "threshold0.9" / "results.jsonl"
    first = read_jsonl(cut)[0]
    cut.write_text(json.dumps(first) + "\n")
    by_rule = report_finished(config)
    greedy_first = next(r for r in read_jsonl(tmp_path / "coedit" / "greedy" / "results.jsonl")
                        if r["request_id"] == first["request_id"])
    assert by_rule["threshold:0.9"]["coedit"] == summarize([first]) | {"benchmark": "coedit", "model": str(tiny_qwen3_dir),
                                                                    "adapter": None, "prompt_format": "chat",
                                                                    "acceptance": "threshold:0.9", "regenerate": "lookup"}
    assert by_rule["greedy"]["coedit"]["requests"] == 1
    assert by_rule["greedy"]["coedit"]["speedup_forwards_median"] == summarize([greedy_first])["speedup_forwards_median"]
    assert by_rule["greedy"]["chat"]["requests"] == by_rule["threshold:0.9"]["chat"]["requests"] == 2
    assert "| coedit | token F1 | 1 |" in (tmp_path / "report.md").read_text()
    with pytest.raises(FileNotFoundError, match="no request has finished"):
        report_finished(replace(config, output_dir=str(tmp_path / "empty")))


def test_suite_rejects_data_paths_of_benchmarks_it_does_not_run(tmp_path):
    config = EvalConfig(benchmarks=["mbpp"], data_paths={"coedit": "x.jsonl"}, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="coedit"):
        run_suite(config)


def test_suite_report_lists_each_rule():
    summaries = {"mbpp": {"evaluated": 1, "quality_base": 1.0, "quality_stream": 1.0}}
    report = suite_report({"greedy": summaries, "threshold:0.9": summaries}, {"mbpp": "pass@1"}, "t")
    assert "## acceptance `greedy`" in report and "## acceptance `threshold:0.9`" in report
