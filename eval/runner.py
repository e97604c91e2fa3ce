"""Run a streaming evaluation: per-request records appended as they finish,
a rerun resumes where the last one stopped, then the summary and its table."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from eval.benchmarks import Benchmark, Request, data_fingerprint, get_benchmark
from eval.config import EvalConfig
from eval.engines.ar import AREngine
from eval.engines.base import StreamingEngine, UpdateResult
from eval.engines.bidirectional import BidirectionalEngine
from eval.engines.decode import AR_ENGINES, DIFFUSION_ENGINES, DecodeSpec
from eval.engines.fast_path import Drafter, Drafting, TransformersDrafter, final_update, greedy_drafting, round_drafts
from eval.engines.refusion import RefusionEngine
from eval.records import append_record, load_records
from eval.reporting.metrics import running_medians, summarize
from eval.reporting.tables import markdown_table
from eval.shards import MANIFEST, SHARDS_DIR, Shard, merge_into, merged_records, parse_shard, shard_dir, write_manifest
from eval.reporting.typing_report import typing_report
from headstart.config import config_to_dict, dump_config
from headstart.devices import resolve_device
from headstart.models import LoadedModel, load_model, weights_fingerprint
from headstart.prompts import build_messages, encode_prompt, resolve_system_message
from headstart.refusion import mask_token_id
from headstart.run_dir import check_output_dir, check_writable, only_entries, write_mark
from headstart.segment import prefixes
from headstart.vllm_client import needed_model_len, vllm_unavailable

# Settings that change the numbers, beside the decode settings' own (DecodeSpec.result_keys):
# a resumed run must match on all of them. `sandbox_cpu_seconds` decides verdicts (a program
# killed at the limit fails); `backend` decides where drafts are decoded (the same tokens up
# to floating-point near-ties, which can change what is accepted). The other EvalConfig fields
# change no recorded number: `limit`, `shard`, `output_dir` choose which requests run and
# where; `fast_batch_size` how drafts are batched (greedy decoding per prompt, the same
# forwards); `vllm` the engines' memory, parallelism and compilation; `record_tokens` and
# `typing`/`typing_policy` add fields or a report derived from the records; `benchmarks`,
# `data_paths`, `acceptances`, `report_only` are the suite's (each run gets its own benchmark,
# data_path and acceptance); `device` is not a key: a merge or report job runs where no model
# loads (a CPU node for a GPU run's shards), and counts do not depend on it.
RESULT_KEYS = ("model", "adapter", "benchmark", "data_path", "system_prompt", "dtype", "sandbox_cpu_seconds",
               "backend")
# And what they were computed from, by content: the weights loaded (model and adapter,
# headstart.models.weights_fingerprint) and the data read (eval.benchmarks.data_fingerprint).
# The same path holding other weights (a retrained adapter) is other settings.
FINGERPRINT_KEYS = ("weights_fingerprint", "data_fingerprint")
# What results written before a setting existed were made with, where that differs from its
# default. Results written before fingerprints were recorded were made
# from unknown bytes (None): they resume with a warning, and their config.json keeps None (it
# never vouches for them). `sandbox_cpu_seconds` and `backend` were added at their defaults
# (the benchmark's own limit; transformers, the only backend then).
LEGACY_SETTINGS = {"regenerate": "plain", "weights_fingerprint": None, "data_fingerprint": None}
# What the evaluator writes into a results directory (config.json aside).
EVALUATOR_FILES = ("results.jsonl", "summary.json", "report.md", "config.yaml")
# Everything a results directory of an earlier version (without headstart.run_dir.MARK) may
# hold: such a directory is recognised by these names only, and by config.json beside config.yaml.
EVALUATOR_NAMES = {*EVALUATOR_FILES, "config.json", "results.jsonl.partial", "typing.json", "typing_curve.png", SHARDS_DIR,
                   MANIFEST}
RUN_KIND = "eval"


class StreamingEvaluator:
    """Evaluates requests one at a time with the configured engine, baseline included."""

    def __init__(self, loaded: LoadedModel, config: EvalConfig, requests: list[Request] | None = None) -> None:
        """`requests`: what it will evaluate, for the drafting cache vLLM reserves (None: the model's context)."""
        self.loaded = loaded
        self.config = config
        self.decode = config.decode
        # The fast path batches AR drafting across requests: AR decoding only.
        self.fast = self.decode.fast
        self.engine = build_engine(loaded, self.decode)
        self.system = resolve_system_message(config.system_prompt, config.adapter or config.model)
        eos = self.engine.eos_token_ids
        self.drafter = build_drafter(loaded, config, eos, self.needed_model_len(requests)) if self.fast else None

    def close(self) -> None:
        """Stop the drafting engines (vLLM's processes); the transformers model stays loaded."""
        if self.drafter:
            self.drafter.close()

    def prompts(self, request: Request) -> list[list[int]]:
        """Token ids of the templated prompt after each segment S_1..S_n."""
        tokenizer, family = self.loaded.tokenizer, self.loaded.family
        return [
            encode_prompt(tokenizer, build_messages(known, request.history, self.system), family)
            for known in prefixes(request.segments)
        ]

    def needed_model_len(self, requests: list[Request] | None) -> int | None:
        """The longest prompt + answer vLLM drafting is sent, over every prefix (BPE can spend more
        tokens on a prefix than on the whole request); None without requests, or when drafting is
        not on vLLM."""
        if not requests or self.config.backend != "vllm":
            return None
        longest = max(len(prompt) for request in requests for prompt in self.prompts(request))
        return needed_model_len(longest, self.decode.max_new_tokens)

    def warm_up(self, request: Request) -> None:
        """One untimed decode so that wall clock is measured on a warm model."""
        state = self.engine.new_state()
        self.engine.forward(state, self.prompts(request)[-1], phase=None)

    def evaluate(self, request: Request) -> dict[str, Any]:
        """Stream one request and decode its baseline; the record of both."""
        return self.evaluate_many([request])[0]

    def evaluate_many(self, requests: list[Request]) -> list[dict[str, Any]]:
        """Records of several requests; the fast path decodes all their drafts in one batch."""
        if not self.fast:
            return [self._evaluate_stepwise(request) for request in requests]
        prompts = [self.prompts(request) for request in requests]
        records = []
        for request, request_prompts, drafting in zip(requests, prompts, self.drafts(prompts)):
            final = final_update(self.engine, request_prompts, drafting)
            records.append(self._record(request, *self._baselines(request_prompts[-1]), final, drafting))
        return records

    def drafts(self, prompts: list[list[list[int]]]) -> list[Drafting]:
        """Each request's drafts D_1..D_{n-1} and their forwards, batched across requests."""
        decode, eos = self.decode, self.engine.eos_token_ids
        if not decode.rule.lossless:
            return round_drafts(self.drafter, [p[:-1] for p in prompts], decode, eos)
        drafts = self.drafter.greedy([p for request in prompts for p in request[:-1]], decode.max_new_tokens)
        results = []
        for request_prompts in prompts:
            request_drafts, drafts = drafts[: len(request_prompts) - 1], drafts[len(request_prompts) - 1 :]
            results.append(greedy_drafting(request_drafts, request_prompts, decode, eos))
        return results

    def _evaluate_stepwise(self, request: Request) -> dict[str, Any]:
        prompts = self.prompts(request)
        stream = self.engine.stream(prompts)
        drafting = Drafting([step.answer for step in stream.steps[:-1]], stream.drafting_forwards)
        return self._record(request, *self._baselines(prompts[-1]), stream.final, drafting)

    def request_groups(self, requests: list[Request]) -> list[list[Request]]:
        """Consecutive requests whose drafts fit one fast-path batch (one each when stepwise)."""
        if not self.fast:
            return [[request] for request in requests]
        # Greedy decodes every prefix of a group in one batch; other rules one per request per round.
        def width(request: Request) -> int:
            return len(request.segments) - 1 if self.decode.rule.lossless else 1

        groups: list[list[Request]] = [[]]
        for request in requests:
            if groups[-1] and sum(map(width, groups[-1])) + width(request) > self.config.fast_batch_size:
                groups.append([])
            groups[-1].append(request)
        return [group for group in groups if group]

    def _baselines(self, prompt_ids: list[int]) -> tuple[UpdateResult, UpdateResult | None]:
        """S_n decoded from scratch: plain greedy, and the lookup decoder with the
        request as its only source (when regenerating by lookup)."""
        lookup = self.engine.lookup_baseline(prompt_ids) if self.decode.lookup else None
        return self.engine.baseline(prompt_ids), lookup

    def _record(self, request: Request, baseline: UpdateResult, lookup: UpdateResult | None,
                final: UpdateResult, drafting: Drafting) -> dict[str, Any]:
        decode = self.loaded.tokenizer.decode
        base_answer = decode(baseline.answer, skip_special_tokens=True)
        stream_answer = decode(final.answer, skip_special_tokens=True)
        record = {
            "request_id": request.request_id,
            "segments": request.segments,
            "n_segments": len(request.segments),
            "base_answer": base_answer,
            "stream_answer": stream_answer,
            "base_tokens": len(baseline.answer),
            "stream_tokens": len(final.answer),
            "draft_tokens": final.draft_length,
            "accepted_tokens": final.accepted,
            "identical": baseline.answer == final.answer,
            "baseline_forwards": baseline.forwards,
            "residual_forwards": final.forwards,
            "drafting_forwards": drafting.forwards,
            "baseline_seconds": baseline.seconds,
            "residual_seconds": final.seconds,
            "min_residual_forwards": self.engine.min_residual_forwards,
            "engine": "fast" if self.fast else ("stepwise" if self.decode.engine in AR_ENGINES else self.decode.engine),
            "drafting_backend": self.config.backend if self.fast else "transformers",
        }
        if self.config.typing:  # what eval.typing_sim re-derives drafts and costs from
            record |= {"prompt_token_ids": self.prompts(request), "eos_token_ids": sorted(self.engine.eos_token_ids)}
        if self.config.record_tokens or self.config.typing:
            record |= {"draft_token_ids": drafting.drafts, "base_token_ids": baseline.answer,
                       "stream_token_ids": final.answer}
        if lookup:
            record |= {
                "lookup_baseline_forwards": lookup.forwards,
                "lookup_baseline_seconds": lookup.seconds,
                "lookup_baseline_identical": lookup.answer == baseline.answer,
            }
        return record


def build_drafter(loaded: LoadedModel, config: EvalConfig, eos: set[int], needed_len: int | None = None) -> Drafter:
    """What the fast path drafts on: the loaded model, or vLLM engines on the same weights
    (`backend=vllm`; the timed residual phase and the baselines stay on the loaded model)."""
    if config.backend == "vllm":
        from eval.engines.vllm_drafter import VLLMDrafter

        return VLLMDrafter.start(config.model, config.adapter, config.vllm, config.dtype, str(loaded.model.device), eos,
                                 needed_len)
    return TransformersDrafter(loaded.model, loaded.tokenizer.pad_token_id, eos, config.fast_batch_size)


def build_engine(loaded: LoadedModel, decode: DecodeSpec) -> StreamingEngine:
    """The decoder `decode.engine` names; the diffusion decoders need the mask token
    (a clear error from `mask_token_id` when the model lacks it)."""
    eos = loaded.eos_token_ids
    if decode.engine == "refusion":
        return RefusionEngine(loaded.model, mask_token_id(loaded.tokenizer), eos, decode)
    if decode.engine == "bidirectional":
        return BidirectionalEngine(loaded.model, mask_token_id(loaded.tokenizer), eos, decode)
    return AREngine(loaded.model, eos, decode)


def default_output_dir(config: EvalConfig) -> Path:
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config.adapter or config.model).name)
    decode = config.decode
    decoder = f"-{decode.engine}" if decode.engine in DIFFUSION_ENGINES else f"-{decode.regenerate}"
    return Path("outputs") / "eval" / f"{config.benchmark}-{model}-{decode.acceptance.replace(':', '')}{decoder}"


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


def prepare_evaluation(config: EvalConfig, requests: list[Request] | None = None) -> PreparedRun:
    """Everything that can be refused, checked before a model loads or a file is written:
    the benchmark name, its data (read whole: a bad line, a missing field, an empty file
    or no streamable request is an error), the model and adapter sources (fingerprinted),
    the results already in output_dir (same settings, same bytes) and, for a run that
    was sharded, its shards (all there, finished, same settings; eval.shards)."""
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
    current = result_settings(config)
    resolve_system_message(config.system_prompt, config.adapter or config.model)  # the model's record, read now
    check_writable(output_dir)  # a PermissionError once the model had loaded, and never with limit=0
    shard = parse_shard(config.shard)
    if shard:
        # A shard may hold no request (more shards than requests): it finishes at once.
        directory = shard_dir(output_dir, shard)
        check_output_dir(output_dir, RUN_KIND, legacy=_legacy_results_dir)  # the run it is a shard of
        return PreparedRun(directory, _check_resumable(directory, current), benchmark, shard.select(requests), shard)
    settings = _check_resumable(output_dir, current)
    # limit=0 reads every request, not the selection the shards were given: nothing to merge.
    merged = None if config.limit == 0 else merged_records(output_dir, current, [r.request_id for r in requests])
    return PreparedRun(output_dir, settings, benchmark, requests, merged=merged)


def start_results(prepared: PreparedRun, config: EvalConfig) -> None:
    """Create the results directory and record its settings (after `prepare_evaluation`);
    a shard also records its requests, a sharded run gets its shards' records."""
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
    requests: list[Request] | None = None,
) -> dict[str, Any]:
    """Evaluate, appending to results.jsonl; returns the summary (also written).
    `loaded` is the model, or what loads it, called only when a request is left to
    compute (a run whose results are all there, e.g. merged shards, loads nothing).
    `requests` replaces the benchmark's first `limit` (scored by the same benchmark).
    With limit=0 it only checks (`prepare_evaluation`): nothing loads, nothing is written."""
    prepared = prepare_evaluation(config, requests)
    if config.limit == 0:
        print(f"limit=0: {config.benchmark} checked ({len(prepared.requests)} requests, model and data found, "
              f"{prepared.output_dir} resumable); nothing evaluated, nothing written")
        return {}
    start_results(prepared, config)
    output_dir, benchmark, requests = prepared.output_dir, prepared.benchmark, prepared.requests
    results_path = output_dir / "results.jsonl"
    records = load_records(results_path)
    done = {r["request_id"] for r in records}
    todo = [r for r in requests if r.request_id not in done]
    if todo:
        if callable(loaded):
            loaded = loaded()
        loaded = loaded or load_model(config.model, adapter=config.adapter, dtype=config.dtype, device=config.device)
        evaluator = StreamingEvaluator(loaded, config, todo)
        try:
            evaluator.warm_up(todo[0])
            shard = f" shard {prepared.shard}" if prepared.shard else ""
            progress = tqdm(desc=f"{config.benchmark} {config.decode.acceptance}{shard}", initial=len(done), total=len(requests))
            for group in evaluator.request_groups(todo):
                if evaluator.fast:
                    drafts = sum(len(request.segments) - 1 for request in group)
                    progress.set_postfix_str(f"decoding {drafts} drafts of {len(group)} requests in one batch")
                for request, record in zip(group, evaluator.evaluate_many(group)):
                    record |= _scores(benchmark, request, record)
                    append_record(results_path, record)
                    records.append(record)
                    progress.update()
                    progress.set_postfix(running_medians(records))
            progress.close()
        finally:
            evaluator.close()
    wanted = {r.request_id for r in requests}
    summary = summarize([r for r in records if r["request_id"] in wanted])
    summary |= summary_labels(config) | {key: prepared.settings[key] for key in FINGERPRINT_KEYS}
    typing = typing_report(config, [r for r in records if r["request_id"] in wanted], output_dir, summary)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = markdown_table({config.benchmark: summary})
    (output_dir / "report.md").write_text(f"# Streaming evaluation ({decode_label(config.decode)})\n\n"
                                          f"{timing_note(config)}\n\n{table}\n{typing}")
    print(f"\n{table}\n\nresults: {results_path}")
    return summary


def summary_labels(config: EvalConfig) -> dict[str, Any]:
    """What a summary was measured on: benchmark, model, adapter, acceptance rule and regeneration."""
    return {"benchmark": config.benchmark, "model": config.model, "adapter": config.adapter,
            "acceptance": config.decode.acceptance, "regenerate": config.decode.regenerate}


def timing_note(config: EvalConfig) -> str:
    """Where the work ran, and which of it was timed (the report says so: vLLM drafts but never times)."""
    if not config.decode.fast:
        return "Every update decoded on transformers at batch 1, each one timed."
    return (f"Drafting (counted, not timed) on {config.backend}; the baselines and the timed residual phase "
            "on transformers at batch 1.")


def decode_label(decode: DecodeSpec) -> str:
    """A short name of the decode settings for titles: acceptance rule and regeneration."""
    return f"{decode.acceptance}, regenerate={decode.regenerate}"


def _scores(benchmark, request: Request, record: dict[str, Any]) -> dict[str, Any]:
    """Score both answers; identical answers are executed once. `containment`: what the
    executed programs ran under, and where their tests ran (eval/sandbox.py)."""
    base = benchmark.score(request, record["base_answer"])
    stream = base if record["stream_answer"] == record["base_answer"] else benchmark.score(request, record["stream_answer"])
    return {"base_score": base.value, "stream_score": stream.value, "base_status": base.detail, "stream_status": stream.detail,
            "containment": "; ".join(sorted({base.containment, stream.containment} - {""}))}


def result_settings(config: EvalConfig) -> dict[str, Any]:
    """The settings that decide the numbers, flat, and the fingerprints of the weights and
    data (config.json of a results directory). Fails when the model, adapter or data is absent."""
    values = config_to_dict(config)
    decode = values.pop("decode")
    settings = {k: values[k] for k in RESULT_KEYS} | {k: decode[k] for k in config.decode.result_keys()}
    return settings | {
        "weights_fingerprint": weights_fingerprint(config.model, config.adapter),
        "data_fingerprint": data_fingerprint(config.benchmark, config.data_path),
    }


def saved_settings(output_dir: Path) -> dict[str, Any]:
    """A results directory's settings (config.json), every setting named: one added
    after these results were written had its default then (or the value
    LEGACY_SETTINGS records, where the default has changed since)."""
    defaults = {f.name: f.default for f in fields(EvalConfig) + fields(DecodeSpec) if f.default is not MISSING}
    path = output_dir / "config.json"
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error}); the settings of these results are unknown") from error
    return defaults | LEGACY_SETTINGS | saved


def saved_config(output_dir: Path) -> EvalConfig:
    """The evaluation config that wrote a results directory (its number-deciding settings)."""
    settings = saved_settings(output_dir)
    decode = DecodeSpec(**{f.name: settings[f.name] for f in fields(DecodeSpec)})
    return EvalConfig(**{k: settings[k] for k in RESULT_KEYS}, decode=decode, output_dir=str(output_dir))


def _check_resumable(output_dir: Path, current: dict[str, Any]) -> dict[str, Any]:
    """Refuse to write into a directory headstart did not create (headstart.run_dir), and to
    mix results of different settings, or of other weights or data, in one directory. A
    directory without progress (no result, no shard's result) is no run: a new launch there
    starts afresh. Reads only; returns the settings config.json is to record."""
    if check_output_dir(output_dir, RUN_KIND, legacy=_legacy_results_dir) == "new" or not _has_progress(output_dir):
        return current
    if not (output_dir / "config.json").exists():
        found = [name for name in EVALUATOR_FILES if (output_dir / name).exists()]
        if found:
            raise ValueError(f"{output_dir} holds {', '.join(found)} but no config.json: the settings, weights and data "
                             "of those results are unknown; choose another output_dir")
        return current
    saved = saved_settings(output_dir)
    unrecorded = [k for k in FINGERPRINT_KEYS if saved[k] is None]
    changed = {k: (saved[k], v) for k, v in current.items() if k not in unrecorded and saved[k] != v}
    if changed:
        detail = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ValueError(f"{output_dir} holds results of other settings ({detail}); choose another output_dir "
                         f"(or move {output_dir} away to compute them again)")
    results = output_dir / "results.jsonl"
    if unrecorded and results.exists() and results.stat().st_size:
        print(f"warning: {output_dir} predates fingerprints ({', '.join(unrecorded)} unrecorded): its results cannot "
              "be checked against the weights and data of this run", file=sys.stderr)
        return current | {k: None for k in unrecorded}
    return current


def _legacy_results_dir(directory: Path) -> bool:
    """A results directory of an earlier version (no run record): only the evaluator's names,
    with config.json beside config.yaml, or a sharded run's shards/ alone."""
    if not only_entries(directory, EVALUATOR_NAMES) or not _has_progress(directory):
        return False  # names alone do not make a results directory: a user's config.json is no result
    if (directory / "config.json").is_file() and (directory / "config.yaml").is_file():
        return True
    shards = directory / SHARDS_DIR
    return shards.is_dir() and all(_legacy_results_dir(shard) for shard in shards.iterdir() if shard.is_dir())


def _has_progress(directory: Path) -> bool:
    """Whether a results directory holds a result (its own, or one of its shards')."""
    shards = directory / SHARDS_DIR
    candidates = [directory] + ([p for p in shards.iterdir() if p.is_dir()] if shards.is_dir() else [])
    return any((p / "results.jsonl").is_file() and (p / "results.jsonl").stat().st_size for p in candidates)
