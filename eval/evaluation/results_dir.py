"""A results directory's settings: what decides its numbers (config.json), and the
check that a rerun may resume it (same settings, same weights and data)."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from eval.benchmarks import benchmark_fingerprint
from eval.engines.decode import DecodeSpec
from eval.engines.width_table import AUTO, auto_path
from eval.evaluation.config import EvalConfig
from eval.evaluation.shards import SHARDS_DIR, recorded_settings
from headstart.config import config_to_dict
from headstart.devices import resolve_device
from headstart.models import weights_fingerprint
from headstart.run_dir import check_output_dir

# Settings that change the numbers, beside the decode settings' own (DecodeSpec.result_keys):
# a resumed run must match on all of them. `sandbox_cpu_seconds` decides verdicts (a program
# killed at the limit fails); `backend` decides where drafts are decoded (the same tokens up
# to floating-point near-ties, which can change what is accepted); `timed_every` which records carry
# wall clock (a resume that changed it would time another sample). The other EvalConfig fields
# change no recorded number: `limit`, `shard`, `output_dir` choose which requests run and
# where; `fast_batch_size` how drafts are batched (greedy decoding per prompt, the same
# forwards); `vllm` the engines' memory, parallelism and compilation; `record_tokens` and
# `typing`/`typing_policy` add fields or a report derived from the records; `benchmarks`,
# `data_paths`, `acceptances`, `report_only` are the suite's (each run gets its own benchmark,
# data_path and acceptance); `device` is not a key: a merge or report job runs where no model
# loads (a CPU node for a GPU run's shards), and counts do not depend on it.
# `dtype` is recorded as asked (null: the device's default); the dtype the numbers were computed in is
# each record's own "dtype", which a resume (eval.evaluation.runner.check_computed_dtype) and a merge of shards
# (eval.evaluation.shards.merged_records) must match: a CPU fp32 run never resumes on a GPU in bf16.
RESULT_KEYS = ("model", "adapter", "benchmark", "data_path", "system_prompt", "prompt_format", "dtype",
               "sandbox_cpu_seconds", "backend", "timed_every")
# And what they were computed from, by content: the weights loaded (model and adapter,
# headstart.models.weights_fingerprint) and the data read (eval.benchmarks.benchmark_fingerprint).
# The same path holding other weights (a retrained adapter) is other settings.
FINGERPRINT_KEYS = ("weights_fingerprint", "data_fingerprint")
# What the evaluator writes into a results directory (config.json aside).
EVALUATOR_FILES = ("results.jsonl", "summary.json", "report.md", "config.yaml")
RUN_KIND = "eval"


def result_settings(config: EvalConfig, device: str | None = None) -> dict[str, Any]:
    """The settings that decide the numbers, flat, and the fingerprints of the weights and
    data (config.json of a results directory). Fails when the model, adapter or data is absent.

    Args:
        config: the run's settings.
        device: the device the run computes on, as `prepare_evaluation` resolved it (it names
            `width_cost=auto`'s table); None: resolved from `config.device`.
    """
    values = config_to_dict(config)
    decode = values.pop("decode")
    settings = {k: values[k] for k in RESULT_KEYS} | {k: decode[k] for k in config.decode.result_keys()}
    if settings.get("width_cost") == AUTO:  # the table this machine's `auto` names: another machine's counts differ
        settings["width_cost"] = str(auto_path(config.model, device or resolve_device(config.device)))
    return settings | {
        "weights_fingerprint": weights_fingerprint(config.model, config.adapter),
        "data_fingerprint": benchmark_fingerprint(config.benchmark, config.data_path),
    }


def saved_config(output_dir: Path) -> EvalConfig:
    """The evaluation config that wrote a results directory (its number-deciding settings;
    those config.json does not record, the decode settings its engine and regeneration
    mode ignore, at their defaults).

    Args:
        output_dir (Path): the results directory.
    """
    defaults = {f.name: f.default for f in fields(EvalConfig) + fields(DecodeSpec) if f.default is not MISSING}
    settings = defaults | recorded_settings(output_dir)
    decode = DecodeSpec(**{f.name: settings[f.name] for f in fields(DecodeSpec)})
    return EvalConfig(**{k: settings[k] for k in RESULT_KEYS}, decode=decode, output_dir=str(output_dir))


def check_resumable(output_dir: Path, current: dict[str, Any]) -> dict[str, Any]:
    """Refuse to write into a directory headstart did not create (headstart.run_dir), and to
    mix results of different settings, or of other weights or data, in one directory. A
    directory without progress (no result, no shard's result) is no run: a new launch there
    starts afresh. Reads only; returns the settings config.json is to record.

    Args:
        output_dir (Path): the results directory.
        current (dict[str, Any]): this run's number-deciding settings and fingerprints (`result_settings`).
    """
    if check_output_dir(output_dir, RUN_KIND) == "new" or not _has_progress(output_dir):
        return current
    if not (output_dir / "config.json").exists():
        found = [name for name in EVALUATOR_FILES if (output_dir / name).exists()]
        if found:
            raise ValueError(f"{output_dir} holds {', '.join(found)} but no config.json: the settings, weights and data "
                             "of those results are unknown; choose another output_dir")
        return current
    # a setting it does not record is a difference (eval.evaluation.shards.ADDED_SETTINGS aside)
    saved = recorded_settings(output_dir)
    changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
    if changed:
        detail = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise ValueError(f"{output_dir} holds results of other settings ({detail}); choose another output_dir "
                         f"(or move {output_dir} away to compute them again)")
    return current


def _has_progress(directory: Path) -> bool:
    """Whether a results directory holds a result (its own, or one of its shards')."""
    shards = directory / SHARDS_DIR
    candidates = [directory] + ([p for p in shards.iterdir() if p.is_dir()] if shards.is_dir() else [])
    return any((p / "results.jsonl").is_file() and (p / "results.jsonl").stat().st_size for p in candidates)
