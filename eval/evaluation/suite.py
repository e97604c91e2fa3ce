"""Run several benchmarks (and acceptance rules) into one report: Table 1
(quality) and Table 2 (cost and speedup), per benchmark and macro average.

Each benchmark and rule is an ordinary resumable `run_evaluation` in its own
directory under the suite's output_dir, so an interrupted suite continues."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from eval.benchmarks import get_benchmark, quality_metrics
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import prepare_evaluation, run_evaluation, summary_labels
from eval.reporting.metrics import summarize
from eval.reporting.tables import macro_average, suite_report
from headstart.files import read_jsonl
from headstart.models import LoadedModel, load_model
from headstart.paths import outputs_dir
from headstart.run_dir import check_output_dir, write_mark

SUITE_KIND = "eval-suite"


def suite_output_dir(config: EvalConfig) -> Path:
    """The suite's directory: `output_dir`, else outputs/eval/suite-<model>.

    Args:
        config (EvalConfig): the suite's settings.
    """
    if config.output_dir:
        return Path(config.output_dir)
    return outputs_dir("eval", f"suite-{Path(config.adapter or config.model).name}")


def run_suite(config: EvalConfig, loaded: LoadedModel | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Evaluate every benchmark under every rule; writes summary.json and report.md.

    Args:
        config (EvalConfig): the suite's settings.
        loaded (LoadedModel | None): the model, already loaded; None: loaded by the first run with a request left to compute.
    """
    names, rules = _benchmarks_and_rules(config)
    unknown = set(config.data_paths) - set(names)
    if unknown:
        raise ValueError(f"data_paths names benchmarks not in the suite: {', '.join(sorted(unknown))}")
    output_dir = suite_output_dir(config)
    check_output_dir(output_dir, SUITE_KIND)
    # Every run is checked (data, model source, resumable results) before the model loads.
    prepared = {(rule, name): prepare_evaluation(_single(config, name, rule, output_dir)) for rule in rules for name in names}
    if config.limit == 0:
        print(f"limit=0: {len(rules) * len(names)} runs checked; nothing evaluated, nothing written")
        return {}
    write_mark(output_dir, SUITE_KIND)
    # Loaded once, by the first run with a request left to compute (merging shards computes none).
    device = next(iter(prepared.values())).device  # resolved once, by the checks above
    model = loaded or functools.cache(lambda: load_model(config.model, adapter=config.adapter, dtype=config.dtype,
                                                         device=device))
    by_rule: dict[str, dict[str, dict[str, Any]]] = {}
    for rule in rules:
        by_rule[rule] = {}
        for name in names:
            by_rule[rule][name] = run_evaluation(_single(config, name, rule, output_dir), model, prepared=prepared[rule, name])
    if config.shard:
        # Shards running at once must not share a file: the report is the merging run's.
        print(f"\nshard {config.shard} done; the same command without shard merges the shards and writes the report")
    else:
        write_suite_report(output_dir, by_rule, config)
    return by_rule


def report_finished(config: EvalConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """The suite report from the results already written, loading no model: per
    benchmark, the first `limit` requests that every rule has finished, so that the
    rules compare on the same requests (a long run can be reported while it goes on).

    Args:
        config (EvalConfig): the suite's settings.
    """
    names, rules = _benchmarks_and_rules(config)
    output_dir = suite_output_dir(config)
    check_output_dir(output_dir, SUITE_KIND)
    by_rule: dict[str, dict[str, dict[str, Any]]] = {rule: {} for rule in rules}
    for name in names:
        requests = get_benchmark(name, config.data_paths.get(name), config.sandbox_cpu_seconds).load(config.limit)
        finished = {rule: _records_by_id(_run_dir(output_dir, name, rule)) for rule in rules}
        common = [r.request_id for r in requests if all(r.request_id in records for records in finished.values())]
        if not common:
            print(f"{name}: no request finished under every rule; left out")
            continue
        for rule in rules:
            summary = summarize([finished[rule][request_id] for request_id in common])
            by_rule[rule][name] = summary | summary_labels(_single(config, name, rule, output_dir))
    if not any(by_rule.values()):
        raise FileNotFoundError(f"no request has finished under every rule in {output_dir}")
    write_suite_report(output_dir, by_rule, config)
    return by_rule


def _benchmarks_and_rules(config: EvalConfig) -> tuple[list[str], list[str]]:
    """The suite's benchmarks and rules; a lone benchmark or rule when a list is empty."""
    return config.benchmarks or [config.benchmark], config.acceptances or [config.decode.acceptance]


def _single(config: EvalConfig, name: str, rule: str, output_dir: Path) -> EvalConfig:
    """The suite's run of one benchmark under one rule, in its own directory."""
    return replace(config, benchmark=name, decode=replace(config.decode, acceptance=rule), data_path=config.data_paths.get(name),
                   benchmarks=[], acceptances=[], data_paths={}, report_only=False,
                   output_dir=str(_run_dir(output_dir, name, rule)))


def _run_dir(output_dir: Path, name: str, rule: str) -> Path:
    return output_dir / name / rule.replace(":", "")


def _records_by_id(output_dir: Path) -> dict[str, dict[str, Any]]:
    return {record["request_id"]: record for record in read_jsonl(output_dir / "results.jsonl")}


def write_suite_report(output_dir: Path, by_rule: dict[str, dict[str, dict[str, Any]]], config: EvalConfig) -> None:
    """Write the suite's summary.json (with each rule's macro average) and report.md, and print the report.

    Args:
        output_dir (Path): the suite's directory.
        by_rule (dict[str, dict[str, dict[str, Any]]]): each rule's summary per benchmark.
        config (EvalConfig): the suite's settings, for the report's title.
    """
    summary = {rule: dict(s) | {"macro average": macro_average(s)} for rule, s in by_rule.items()}
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    decode = config.decode
    title = (f"Streaming evaluation suite: {config.adapter or config.model}, max_new_tokens={decode.max_new_tokens}, "
             f"regenerate={decode.regenerate}")
    report = suite_report(by_rule, quality_metrics(), title)
    (output_dir / "report.md").write_text(report)
    print(f"\n{report}\nreport: {output_dir / 'report.md'}")
