"""Run a streaming evaluation: per-request records appended as they finish,
a rerun resumes where the last one stopped, then the summary and its table."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from eval.benchmarks import Benchmark, Request, get_benchmark
from eval.engines.decode import DIFFUSION_ENGINES, decode_label
from eval.engines.width_measure import resolve as resolve_width_cost
from eval.engines.width_table import AUTO
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from eval.evaluation.results_dir import FINGERPRINT_KEYS, RUN_KIND, check_resumable, result_settings
from eval.evaluation.shards import Shard, merge_into, merged_records, parse_shard, shard_dir, write_manifest
from eval.reporting.metrics import running_medians, summarize
from eval.reporting.tables import markdown_table
from eval.reporting.typing_report import typing_report
from eval.sandbox import SandboxUnavailable
from headstart.config import dump_config
from headstart.devices import resolve_device
from headstart.files import append_jsonl, read_jsonl
from headstart.models import LoadedModel, default_dtype, dtype_name, load_model, resolve_prompt_format
from headstart.paths import outputs_dir, safe_name
from headstart.prompts import resolve_system_message
from headstart.run_dir import check_output_dir, check_writable, holding_run_dir, write_mark
from headstart.vllm_client import vllm_unavailable


def default_output_dir(config: EvalConfig) -> Path:
    """Where a run's results go without `output_dir`: outputs/eval/<benchmark>-<model>-<acceptance>-<engine or regeneration>.

    Args:
        config (EvalConfig): the run's settings.
    """
    model = safe_name(Path(config.adapter or config.model).name)
    decode = config.decode
    decoder = f"-{decode.engine}" if decode.engine in DIFFUSION_ENGINES else f"-{decode.regenerate}"
    return outputs_dir("eval", f"{config.benchmark}-{model}-{decode.acceptance.replace(':', '')}{decoder}")


@dataclass
class PreparedRun:
    """An evaluation checked before anything loads or is written: where it goes, the
    settings (with fingerprints) config.json records, its benchmark and requests; for a
    shard, which one; for a run whose shards are done, their records (to merge)."""

    output_dir: Path
    settings: dict[str, Any]
    benchmark: Benchmark
    requests: list[Request]
    shard: Shard | None = None
    merged: list[dict[str, Any]] | None = None
    untimed: frozenset[str] = frozenset()  # count mode: requests counted from batched drafts, not timed
    device: str = "cpu"  # the device the run computes on, resolved once (`resolve_device`)
    system: str | None = None  # the system message, resolved once (`resolve_system_message`)


def prepare_evaluation(config: EvalConfig, requests: list[Request] | None = None) -> PreparedRun:
    """Everything that can be refused, checked before a model loads or a file is written:
    the benchmark name, its data (read whole: a bad line, a missing field, an empty file
    or no streamable request is an error), the model and adapter sources (fingerprinted),
    the results already in output_dir (same settings, same bytes) and, for a run that
    was sharded, its shards (all there, finished, same settings; eval.evaluation.shards).

    Args:
        config (EvalConfig): the run's settings.
        requests (list[Request] | None): the requests to evaluate; None: the benchmark's first `limit`.
    """
    output_dir = Path(config.output_dir) if config.output_dir else default_output_dir(config)
    device = resolve_device(config.device)  # a GPU asked for where CUDA is unusable: refused here, not run on CPU
    benchmark = get_benchmark(config.benchmark, config.data_path, config.sandbox_cpu_seconds)
    if requests is None:
        requests = benchmark.load(None if config.limit == 0 else config.limit)
    if not requests:
        source = config.data_path or "its default source"
        raise ValueError(f"{config.benchmark}: no request with two or more segments in {source}: nothing to evaluate")
    if config.backend == "vllm" and (reason := vllm_unavailable(config.vllm, device)):
        raise ValueError(f"backend=vllm: {reason}")
    current = result_settings(config, device)
    # Positions in the whole selection, not in a shard's: sharded and unsharded runs time the same requests.
    untimed = frozenset(r.request_id for i, r in enumerate(requests) if i % config.timed_every)
    system = resolve_system_message(config.system_prompt, config.adapter or config.model)  # the model's record, read now
    check_writable(output_dir)  # a PermissionError once the model had loaded, and never with limit=0
    shard = parse_shard(config.shard)
    if shard:
        # A shard may hold no request (more shards than requests): it finishes at once.
        directory = shard_dir(output_dir, shard)
        check_output_dir(output_dir, RUN_KIND)  # the run it is a shard of
        return PreparedRun(directory, check_resumable(directory, current), benchmark, shard.select(requests), shard,
                           untimed=untimed, device=device, system=system)
    settings = check_resumable(output_dir, current)
    # limit=0 reads every request, not the selection the shards were given: nothing to merge.
    merged = None if config.limit == 0 else merged_records(output_dir, current, [r.request_id for r in requests])
    return PreparedRun(output_dir, settings, benchmark, requests, merged=merged, untimed=untimed, device=device,
                       system=system)


def start_results(prepared: PreparedRun, config: EvalConfig) -> None:
    """Create the results directory and record its settings (after `prepare_evaluation`);
    a shard also records its requests, a sharded run gets its shards' records.

    Args:
        prepared (PreparedRun): the checked run.
        config (EvalConfig): the run's settings, written as config.yaml.
    """
    if prepared.shard:  # the run the shard belongs to: marked, so that the merging run may write there
        write_mark(prepared.output_dir.parent.parent, RUN_KIND)
    write_mark(prepared.output_dir, RUN_KIND)  # before any other file: the directory is headstart's
    (prepared.output_dir / "config.json").write_text(json.dumps(prepared.settings, indent=2) + "\n")
    dump_config(config, prepared.output_dir / "config.yaml")
    if prepared.shard:
        write_manifest(prepared.output_dir, prepared.shard, [r.request_id for r in prepared.requests])
    if prepared.merged is not None:
        merge_into(prepared.output_dir / "results.jsonl", prepared.merged)


def run_evaluation(
    config: EvalConfig, loaded: LoadedModel | Callable[[], LoadedModel] | None = None,
    requests: list[Request] | None = None, prepared: PreparedRun | None = None,
) -> dict[str, Any]:
    """Evaluate, appending to results.jsonl; returns the summary (also written).
    With limit=0 it only checks (`prepare_evaluation`): nothing loads, nothing is written.

    Args:
        config (EvalConfig): the run's settings.
        loaded (LoadedModel | Callable[[], LoadedModel] | None): the model, or what loads it, called only when a
            request is left to compute (a run whose results are all there, e.g. merged shards, loads nothing);
            None: `config.model`.
        requests (list[Request] | None): replaces the benchmark's first `limit` (scored by the same benchmark).
        prepared (PreparedRun | None): `prepare_evaluation(config, requests)` where the caller checked the run already
            (its device, system message and fingerprints are resolved once); None: prepared here.
    """
    prepared = prepared or prepare_evaluation(config, requests)
    if config.limit == 0:
        print(f"limit=0: {config.benchmark} checked ({len(prepared.requests)} requests, model and data found, "
              f"{prepared.output_dir} resumable); nothing evaluated, nothing written")
        return {}
    with holding_run_dir(prepared.output_dir):  # a second run on it at once would compute and append the same requests
        start_results(prepared, config)
        records = read_jsonl(prepared.output_dir / "results.jsonl")
        done = {record["request_id"] for record in records}
        todo = [r for r in prepared.requests if r.request_id not in done]
        if todo:
            _compute(prepared, config, todo, records, loaded)
        return _report(prepared, config, records, todo)


def _compute(prepared: PreparedRun, config: EvalConfig, todo: list[Request], records: list[dict[str, Any]],
             loaded: LoadedModel | Callable[[], LoadedModel] | None) -> None:
    """Evaluate the requests left (`todo`), appending each record to results.jsonl and `records` as it finishes."""
    results_path = prepared.output_dir / "results.jsonl"
    if not loaded:  # refused before minutes of loading: the dtype this run will load in
        check_computed_dtype(records, config.dtype or dtype_name(default_dtype(prepared.device)), results_path)
    if callable(loaded):
        loaded = loaded()
    loaded = loaded or load_model(config.model, adapter=config.adapter, dtype=config.dtype, device=prepared.device)
    check_computed_dtype(records, dtype_name(loaded.model.dtype), results_path)
    if config.decode.rule.lossless and loaded.model.dtype != torch.float32:
        print(f"note: greedy decoding in {dtype_name(loaded.model.dtype)} is not batch-invariant: a streamed answer may "
              "depart from its baseline (summary.json's identical_to_baseline measures it); dtype=float32 for exact "
              "identity (docs/evaluation.md#identity)", file=sys.stderr)
    evaluator = StreamingEvaluator(loaded, config, todo, prepared.untimed, prepared.system)
    try:
        timed = [r for r in todo if r.request_id not in prepared.untimed]
        if timed:
            evaluator.warm_up(timed[0])
        shard = f" shard {prepared.shard}" if prepared.shard else ""
        label = f"{config.benchmark} {config.decode.acceptance}{shard}"
        done = len(prepared.requests) - len(todo)
        with tqdm(desc=label, initial=done, total=len(prepared.requests)) as progress:  # closed before a Ctrl-C's line
            for group in evaluator.request_groups(todo):
                if evaluator.fast:
                    drafts = sum(len(request.segments) - 1 for request in group)
                    progress.set_postfix_str(f"decoding {drafts} drafts of {len(group)} requests in one batch")
                for request, record in zip(group, evaluator.evaluate_many(group)):
                    record |= _scores(prepared.benchmark, request, record)
                    append_jsonl(results_path, [record])
                    records.append(record)
                    progress.update()
                    progress.set_postfix(running_medians(records))
    finally:
        evaluator.close()


def _report(prepared: PreparedRun, config: EvalConfig, records: list[dict[str, Any]], todo: list[Request]) -> dict[str, Any]:
    """Summarize the run's records into summary.json, report.md and typing.json; returns the summary."""
    output_dir, requests = prepared.output_dir, prepared.requests
    results_path = output_dir / "results.jsonl"
    wanted = {r.request_id for r in requests}
    selected = [r for r in records if r["request_id"] in wanted]
    summary = summarize(selected)
    summary |= summary_labels(config) | {key: prepared.settings[key] for key in FINGERPRINT_KEYS}
    if config.typing and config.decode.width_cost == AUTO and not todo:  # no model loaded: this machine's table, read
        config.decode.use_width_table(resolve_width_cost(AUTO, config.model, prepared.device))
    typing = typing_report(config, selected, output_dir, summary)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if summary.get("counted") and summary.get("drafter_agreement", 1.0) < 1.0:
        print(f"warning: the drafter agreed with batch-1 greedy decoding on {summary['drafter_agreement']:.0%} of "
              f"{summary['drafter_compared']} timed requests; the {summary['counted']} counted requests rest on that "
              "agreement, so their counts are not exact (timed_every=1 compares every request; dtype=float32 keeps "
              "identity)", file=sys.stderr)
    table = markdown_table({config.benchmark: summary})
    (output_dir / "report.md").write_text(f"# Streaming evaluation ({decode_label(config.decode)})\n\n"
                                          f"{timing_note(config)}\n\n{table}\n{typing}")
    print(f"\n{table}\n\nresults: {results_path}")
    return summary


def check_computed_dtype(records: list[dict[str, Any]], dtype: str, results_path: Path) -> None:
    """Refuse to add results computed in `dtype` to records computed in another (a CPU fp32 run
    resumed on a GPU in bf16 would mix two models' numbers). Records from before the field: unknown, accepted.

    Args:
        records (list[dict[str, Any]]): the results already written.
        dtype (str): the dtype this run computes in (`float32`, `bfloat16`, ...).
        results_path (Path): the results file, for the error.
    """
    recorded = sorted({r["dtype"] for r in records if r.get("dtype")} - {dtype})
    if recorded:
        raise ValueError(f"{results_path} holds results computed in {', '.join(recorded)}; this run computes in {dtype}: "
                         f"set dtype={recorded[0]} to resume them, or choose another output_dir")


def summary_labels(config: EvalConfig) -> dict[str, Any]:
    """What a summary was measured on: benchmark, model, adapter, prompt format (resolved), acceptance rule
    and regeneration.

    Args:
        config (EvalConfig): the run's settings.
    """
    return {"benchmark": config.benchmark, "model": config.model, "adapter": config.adapter,
            "prompt_format": resolve_prompt_format(config.prompt_format, config.model, config.adapter),
            "acceptance": config.decode.acceptance, "regenerate": config.decode.regenerate}


def timing_note(config: EvalConfig) -> str:
    """Where the work ran, and which of it was timed (the report says so: vLLM drafts but never times).

    Args:
        config (EvalConfig): the run's settings.
    """
    if not config.decode.fast:
        return "Every update decoded on transformers at batch 1, each one timed."
    note = (f"Drafting (counted, not timed) on {config.backend}; the baselines and the timed residual phase "
            "on transformers at batch 1.")
    if config.timed_every > 1:
        note += (f" Count mode: every {config.timed_every}th request timed; the others counted from greedy drafts of "
                 "S_1..S_n decoded in batches (wall clock over the timed requests only).")
    return note


def _scores(benchmark, request: Request, record: dict[str, Any]) -> dict[str, Any]:
    """Score both answers; identical answers are executed once. `containment`: what the
    executed programs ran under, and where their tests ran (eval/sandbox/).
    Whatever an answer's program does fails that answer only; SandboxUnavailable
    means no program can run on this machine (no bwrap, no user namespaces), so the
    run stops at the first answer to execute, named, with nothing recorded for it."""
    try:
        base = benchmark.score(request, record["base_answer"])
        same = record["stream_answer"] == record["base_answer"]
        stream = base if same else benchmark.score(request, record["stream_answer"])
    except SandboxUnavailable as error:
        raise SandboxUnavailable(f"{request.request_id}: the sandbox cannot run its answers (nothing is recorded for "
                                 f"it; a rerun resumes there): {error}") from error
    return {"base_score": base.value, "stream_score": stream.value, "base_status": base.detail, "stream_status": stream.detail,
            "containment": "; ".join(sorted({base.containment, stream.containment} - {""}))}


