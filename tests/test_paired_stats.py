"""Paired comparisons (eval.reporting.paired) on hand-computed cases, and their figure."""

from __future__ import annotations

import json
import math

import pytest

from eval.reporting.paired import NO_CHANGE, compare, compare_sides, pair_records, paired_markdown


def record(request_id: str, residual: int, *, baseline: int = 40, accepted: int = 3, draft: int = 10, score: float = 1.0,
           seconds: float | None = 1.0, answer: str = "x") -> dict:
    """One results.jsonl record with the keys the paired comparison reads."""
    return {"request_id": request_id, "residual_forwards": residual, "baseline_forwards": baseline,
            "baseline_seconds": None if seconds is None else 4.0, "residual_seconds": seconds,
            "accepted_tokens": accepted, "draft_tokens": draft, "stream_score": score, "base_score": score,
            "base_answer": answer, "stream_answer": answer, "base_status": "passed", "drafting_forwards": 30,
            "identical": True}


def side(residuals: list[int], **kwargs) -> list[dict]:
    return [record(f"r{i}", residual, **kwargs) for i, residual in enumerate(residuals)]


RESIDUALS = [5, 9, 4, 14, 7, 8, 11, 6]  # every one above 2: a drop by 2 leaves at least one forward


def test_identical_sides_change_nothing():
    comparison = compare(side(RESIDUALS), side(RESIDUALS))
    assert comparison.requests == 8 and (comparison.lower, comparison.equal, comparison.higher) == (0, 8, 0)
    for name, change in comparison.changes.items():
        assert (change.estimate, change.low, change.high) == (0.0, 0.0, 0.0), name
        assert change.verdict == NO_CHANGE
    assert comparison.wilcoxon_p == comparison.sign_p == 1.0  # no non-zero difference to test


def test_every_request_dropping_by_k_is_a_change_of_minus_k():
    k, n = 2, len(RESIDUALS)
    comparison = compare(side(RESIDUALS), side([r - k for r in RESIDUALS]))
    forwards = comparison.changes["forwards_stream_median"]
    assert (forwards.before, forwards.after) == (7.5, 5.5)
    assert (forwards.estimate, forwards.low, forwards.high) == (-k, -k, -k)
    assert forwards.verdict == "lower"
    assert set(comparison.differences.values()) == {-k}
    assert (comparison.lower, comparison.equal, comparison.higher) == (n, 0, 0)
    assert comparison.sign_p == pytest.approx(2 * 0.5 ** n)
    assert comparison.wilcoxon_p == pytest.approx(2 * 0.5 ** n)  # exact: all ranks on one side, P = 2 / 2**n
    relative = comparison.changes["forwards_stream_median_relative"]
    assert relative.estimate == pytest.approx(5.5 / 7.5 - 1) and relative.high < 0
    # speedup rises, the share of one-forward requests does not move (none reaches 1): no measurable change
    assert comparison.changes["speedup_forwards_median"].verdict == "higher"
    assert comparison.changes["single_forward_share"].verdict == NO_CHANGE


def test_pairing_drops_unmatched_and_empty_answer_requests():
    before = side(RESIDUALS) + [record("only-before", 3)]
    after = side(RESIDUALS) + [record("only-after", 3)]
    after[1] = record("r1", 1, answer="  ")  # empty answer on one side: out on both
    pairs = pair_records(before, after)
    assert [b["request_id"] for b, _ in pairs] == ["r0", "r2", "r3", "r4", "r5", "r6", "r7"]
    comparison = compare(before, after)
    assert comparison.requests == 7 and "r1" not in comparison.differences


def test_untimed_requests_are_left_out_of_the_wall_clock_only():
    before = side(RESIDUALS)
    after = [record(f"r{i}", r, seconds=None if i < 3 else 2.0) for i, r in enumerate(RESIDUALS)]
    comparison = compare(before, after)
    assert comparison.requests == 8 and comparison.wall_requests == 5
    wall = comparison.changes["speedup_wall_median"]
    assert (wall.before, wall.after, wall.estimate) == (4.0, 2.0, -2.0)
    assert "Wall clock paired over 5 timed requests" in paired_markdown({"b": {"after": comparison}})[3]
    untimed = compare(side(RESIDUALS, seconds=None), side(RESIDUALS, seconds=None))
    assert untimed.wall_requests == 0 and "speedup_wall_median" not in untimed.changes


def test_draft_kept_and_pass_at_1_follow_summarize():
    before = side(RESIDUALS, accepted=0, draft=0, score=0.0)  # no drafts: kept is 0, as summarize says
    after = side(RESIDUALS, accepted=5, draft=10)
    changes = compare(before, after).changes
    assert (changes["draft_kept_mean"].before, changes["draft_kept_mean"].after) == (0.0, 0.5)
    assert changes["draft_kept_mean"].verdict == "higher"
    assert (changes["quality_stream"].estimate, changes["quality_stream"].verdict) == (1.0, "higher")


def test_the_bootstrap_is_seeded():
    before, after = side(RESIDUALS), side([4, 10, 1, 9, 7, 8, 6, 6])
    first, again, other = compare(before, after), compare(before, after), compare(before, after, seed=1)
    assert first.changes == again.changes
    assert first.changes != other.changes  # another seed, other resamples
    change = first.changes["forwards_stream_median"]
    assert change.low <= change.estimate <= change.high and not math.isnan(change.low)


def test_no_common_request_is_reported_not_raised():
    comparison = compare(side([3]), [record("other", 2)])
    assert comparison.requests == 0 and comparison.changes == {} and comparison.sign_p is None
    assert "nothing to pair" in paired_markdown({"b": {"after": comparison}})[3]


def test_compare_sides_and_the_figure(tmp_path):
    from eval.reporting.plots import paired_differences

    records = {"humaneval": {"before": side(RESIDUALS), "after": side([r - 1 for r in RESIDUALS]),
                             "distill": side(RESIDUALS)}, "mbpp": {"before": side([3, 4]), "after": side([3, 5])}}
    comparisons = compare_sides(records)
    assert {b: list(s) for b, s in comparisons.items()} == {"humaneval": ["after", "distill"], "mbpp": ["after"]}
    markdown = "\n".join(paired_markdown(comparisons, names={"after": "sft"}))
    assert "## Paired changes: humaneval, sft vs before" in markdown
    assert "| median residual forwards | 7.5 | 6.5 | -1 [-1, -1] | lower |" in markdown
    differences = {b: {s: list(c.differences.values()) for s, c in sides.items()} for b, sides in comparisons.items()}
    assert paired_differences(differences, tmp_path / "paired.png").stat().st_size > 1000


def test_the_study_report_pairs_every_objective_with_the_base(tmp_path, monkeypatch):
    """benchmarks/study_adaptation.py's study.md: a Paired changes table per objective, and the figure."""
    from study_adaptation import StudyConfig, train_recipes
    from study_report import write_study_report

    from eval.reporting.metrics import summarize
    from headstart.files import write_jsonl

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = StudyConfig(objectives={"sft": "smollm2_prefix", "distill": "smollm2_distill"},
                         eval={"benchmarks": ["humaneval"], "system_prompt": "none"}, output_dir=str(tmp_path))
    records = {"before": side(RESIDUALS), "after": side([r - 2 for r in RESIDUALS]), "distill": side(RESIDUALS)}
    for name, rows in records.items():
        (tmp_path / "report" / name / "humaneval").mkdir(parents=True)
        write_jsonl(tmp_path / "report" / name / "humaneval" / "results.jsonl", rows)
    split = {"prompt_tokens": {"mean": 50}, "answer_tokens": {"mean": 60}}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "report.json").write_text(json.dumps(
        {"splits": {"train": {"requests": 4, "rows": 8}}, "tokens": {"splits": {"train": split}}, "drops": {}}))
    point = {"forwards_stream_median": 7.5, "draft_kept_mean": 0.3, "single_forward_share": 0.0, "quality_stream": 1.0}
    points = {objective: [{"step": 0, **point}] for objective in config.objectives}
    losses = {objective: {"0.0001": 1.0} for objective in config.objectives}
    write_study_report(config, train_recipes(config)["sft"], tmp_path, losses, {o: 1e-4 for o in config.objectives},
                       {"humaneval": {name: summarize(rows) for name, rows in records.items()}}, points)
    study = (tmp_path / "study.md").read_text()
    assert "## Paired changes: humaneval, sft vs before" in study and "## Paired changes: humaneval, distill vs before" in study
    assert "| median residual forwards | 7.5 | 5.5 | -2 [-2, -2] | lower |" in study
    assert "figures/paired_differences.png" in study and (tmp_path / "figures" / "paired_differences.png").is_file()
