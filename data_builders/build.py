"""One build: sources -> eligible requests -> chosen requests -> answers -> pairs -> dataset on disk.

Each pass keeps its result in the work directory (the collected requests,
the analysed columns, the answer cache), so a killed build resumes where it
stopped; the output directory is replaced atomically at the very end.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict, DatasetInfo

from data_builders.analyse import VERSION as ANALYSIS_VERSION
from data_builders.analyse import analyse_batch
from data_builders.answers import cut_answers, has_answer
from data_builders.answers import gather as gather_answers
from data_builders.card import length_stats
from data_builders.collect import check_locations, collect, collect_key
from data_builders.config import BuildConfig
from data_builders.decontamination import DecontaminationIndex, build_index
from data_builders.output import (
    after_interrupt,
    check_replaceable,
    discard_replaced,
    open_work_dir,
    remove_work_dir,
    save,
)
from data_builders.pairs import STAT_COLUMNS, expand_batch
from data_builders.report import NOTHING_KEPT, Report
from data_builders.select import choose, column, eligible_rows
from data_builders.sources import SOURCES
from headstart.benchmark_registry import MBPP_SPLIT_IDS
from headstart.completion import completion_frame
from headstart.config import RecipeError
from headstart.device_names import check_device
from headstart.devices import default_device, resolve_device
from headstart.models import model_prompt_family
from headstart.paths import outputs_dir, resolve_path
from headstart.prompts import Family
from headstart.run_dir import check_writable, holding_run_dir
from headstart.vllm_client import vllm_unavailable


def validate(config: BuildConfig, machine: bool = True) -> None:
    """Reject settings that cannot work, naming the key. `machine=False` leaves out what only the
    machine that builds can tell (whether its vLLM runs: slurm/check_args.py validates on a login node).

    Args:
        config (BuildConfig): the build's settings.
        machine (bool): also check what only the building machine can tell.
    """
    choices = {
        "format": (config.format, ("ar", "refusion")),
        "pairs": (config.pairs, ("prefix_to_answer", "draft_refinement")),
        "answers": (config.answers, ("reference", "self")),
        "generation.backend": (config.generation.backend, ("auto", "transformers", "vllm")),
        "decontamination.on_missing": (config.decontamination.on_missing, ("error", "skip")),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise RecipeError(f"{key}={value!r}; choose one of {', '.join(allowed)}")
    if config.pairs == "draft_refinement" and config.format != "refusion":
        raise RecipeError("pairs=draft_refinement needs format=refusion")
    unknown = [s for s in config.sources if s not in SOURCES]
    if not config.sources or unknown:
        raise RecipeError(f"sources: unknown {unknown or 'empty list'}; known: {', '.join(SOURCES)}")
    splits = config.filters.mbpp_splits
    if not splits or not set(splits) <= set(MBPP_SPLIT_IDS) - {"test"}:
        raise RecipeError(f"filters.mbpp_splits={splits}; choose from train, validation, prompt (test is evaluated)")
    if not 0 <= config.validation_fraction < 1:
        raise RecipeError("validation_fraction must be in [0, 1)")
    generation = config.generation
    if machine and generation.backend == "vllm" and _needs_model(config):
        reason = vllm_unavailable(generation.vllm, generation.device or default_device())
        if reason:
            raise RecipeError(f"generation.backend=vllm: {reason}")
    at_least = {"num_proc": (config.num_proc, 1), "generation.batch_size": (generation.batch_size, 1),
                "generation.max_new_tokens": (generation.max_new_tokens, 1),
                "decontamination.ngram": (config.decontamination.ngram, 1),
                "filters.min_segments": (config.filters.min_segments, 2)}  # n = 1 has nothing to stream
    for key, (value, least) in at_least.items():
        if value < least:
            raise RecipeError(f"{key} must be at least {least}, got {value}")
    caps = config.caps
    for key, value in {"caps.max_pairs_per_request": caps.max_pairs_per_request, "caps.max_tokens": caps.max_tokens,
                       "caps.max_pairs": caps.max_pairs, "preview_rows": config.preview_rows}.items():
        if value < 0:
            raise RecipeError(f"{key} must be >= 0 (0: no limit), got {value}")
    try:
        completion_frame(generation.completion_frame)
    except ValueError as error:
        raise RecipeError(f"generation.completion_frame: {error}") from error
    try:
        check_device(generation.device, "generation.device")
    except ValueError as error:
        raise RecipeError(str(error)) from error


def output_paths(config: BuildConfig) -> tuple[Path, Path]:
    """The output directory and the work directory of a build.

    Args:
        config (BuildConfig): the build's settings.
    """
    output = Path(config.output_dir or outputs_dir("data", config.name))
    return output, Path(config.work_dir or f"{output}.work")


def _needs_model(config: BuildConfig) -> bool:
    return config.answers == "self" or config.pairs == "draft_refinement"


def tokenizer_name(config: BuildConfig) -> str | None:
    """The configured tokenizer; else the model's when tokens are capped or a model is used anyway.

    Args:
        config (BuildConfig): the build's settings.
    """
    if config.tokenizer:
        return config.tokenizer
    return config.model if config.caps.max_tokens > 0 or _needs_model(config) else None


def build(config: BuildConfig, command: str = "python -m data_builders") -> Path:
    """Run every pass and return the output directory.

    Args:
        config (BuildConfig): the build's settings.
        command (str): the command line that ran the build, for the dataset card.
    """
    validate(config)
    if config.generation.device:  # a GPU asked for where CUDA is unusable: refused before anything is read
        resolve_device(config.generation.device)
    output, work = output_paths(config)
    check_replaceable(output, work)  # before anything is read or written
    check_writable(output)  # a PermissionError after the whole build, else
    check_writable(work, "work_dir")
    check_locations(config)
    report = Report()
    created, saved = not work.exists(), False
    # Held while building: a second build of this output at once is refused, naming this one's pid.
    with holding_run_dir(work, "work_dir"):
        try:
            open_work_dir(work)
            with report.timed(work, "build"):
                splits = _build_splits(config, output, work, created, report)
            save(DatasetDict(splits), config, report, output, command)
            saved = True
            discard_replaced(output)
            report.forget_seconds(work)  # a finished build: the next build of this name starts its own clock
            if not config.keep_work_dir:
                remove_work_dir(work)
        except KeyboardInterrupt as interrupt:
            raise BuildInterrupted(after_interrupt(output, work, created, saved)) from interrupt
    return output


class BuildInterrupted(KeyboardInterrupt):
    """Ctrl-C during a build, its temporary files removed; its text says what the build kept.
    A KeyboardInterrupt still, for a caller of `build` that stops on one."""


def _build_splits(config: BuildConfig, output: Path, work: Path, created: bool, report: Report) -> dict[str, Dataset]:
    """Every pass up to the finished splits (the output is not written yet)."""
    try:
        requests = collect(config, work, report)
    except BaseException:
        if created:
            remove_work_dir(work)  # an input refused on reading leaves no trace
        raise
    tokenizer = _load_tokenizer(tokenizer_name(config))
    index = _index(config, report)
    analysed = _analyse(requests, config, work, index, tokenizer)
    rows = eligible_rows(analysed, config, _token_budget(analysed, config), report)
    selection = choose(rows, column(analysed, "num_segments"), config, report)
    with report.timed(work, "answers"):
        answers, drafts = gather_answers(analysed, selection, config, work)
    cut = cut_answers(selection.rows(), answers)
    report.drop("answer_hit_token_cap", cut)
    report.drop("empty_answer", int((~has_answer(analysed, selection.rows(), answers)).sum()) - cut)
    splits = {"train": _expand(analysed, selection.train, selection, answers, drafts, config, tokenizer, work, "train", report)}
    if len(selection.validation):
        splits["validation"] = _expand(
            analysed, selection.validation, selection, answers, drafts, config, tokenizer, work, "validation", report
        )
    else:  # an empty split keeps the train columns
        splits["validation"] = splits["train"].select([])
        report.splits["validation"] = {"requests": 0, "rows": 0}
    if tokenizer is not None:
        report.tokens["tokenizer"] = tokenizer_name(config)
    if not len(splits["train"]):
        drops = ", ".join(f"{reason} {count}" for reason, count in report.all_drops().most_common()) or "none"
        raise ValueError(f"no training row is left ({len(requests)} requests read; dropped: {drops}); "
                         f"nothing written to {output}")
    if not len(splits["validation"]):
        # `datasets` cannot read back a split saved without rows: none is written (training skips evaluation).
        del splits["validation"]
    return splits


def _load_tokenizer(name: str | None) -> Any | None:
    if name is None:
        return None
    from headstart.models import load_tokenizer

    return load_tokenizer(name)


def _index(config: BuildConfig, report: Report) -> DecontaminationIndex:
    settings = config.decontamination
    data_dir = resolve_path(settings.data_dir) if settings.data_dir else None  # None: headstart/data/
    index, skipped = build_index(
        settings.benchmarks, data_dir, settings.extra_files, settings.ngram, settings.on_missing, settings.hub
    )
    report.decontamination = {"ngram": settings.ngram, "texts": index.texts_per_benchmark, "skipped": skipped}
    return index


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _prompt_family(config: BuildConfig, tokenizer) -> Family | None:
    """The prompt format an AR model reads its requests in (its token counts); None for ReFusion rows (the bare query)."""
    if config.format != "ar" or tokenizer is None:
        return None
    return model_prompt_family(tokenizer, config.generation.prompt_format, config.model)


def _analyse(requests: Dataset, config: BuildConfig, work: Path, index: DecontaminationIndex, tokenizer) -> Dataset:
    index_id = [len(index.exact), len(index.ngrams), sum(index.exact) % (1 << 61),
                int(index.ngrams.sum(dtype=np.uint64)), index.n]
    family = _prompt_family(config, tokenizer)
    frame = config.generation.completion_frame if family == "completion" else None
    key = _key("analyse", ANALYSIS_VERSION, collect_key(config), index_id, tokenizer_name(config), config.format, family,
               *([frame] if frame else []))  # a chat build's key as before: its cache stays valid
    return requests.map(
        analyse_batch,
        batched=True,
        num_proc=_procs(config, len(requests)),
        fn_kwargs={"index": index, "tokenizer": tokenizer, "family": family, "frame": frame},
        new_fingerprint=key,
        cache_file_name=str(work / f"analysed-{key}.arrow"),
        desc="segment, hash, decontaminate",
    )


def _procs(config: BuildConfig, rows: int) -> int | None:
    procs = min(config.num_proc, max(rows, 1))
    return procs if procs > 1 else None


def _token_budget(analysed: Dataset, config: BuildConfig) -> np.ndarray | None:
    """Upper bound of prompt + draft + answer tokens per request, known before any generation."""
    if config.caps.max_tokens <= 0 or "request_tokens" not in analysed.column_names:
        return None
    budget = column(analysed, "request_tokens").astype(np.int64)
    generated = config.generation.max_new_tokens
    budget += generated if config.answers == "self" else column(analysed, "reference_tokens")
    return budget + (generated if config.pairs == "draft_refinement" else 0)


def _expand(analysed, chosen, selection, answers, drafts, config, tokenizer, work, split, report) -> Dataset:
    subset = analysed.select(chosen)
    expanded = subset.map(
        expand_batch,
        batched=True,
        with_indices=True,
        num_proc=_procs(config, len(chosen)),
        remove_columns=subset.column_names,
        fn_kwargs={
            "rows": chosen,
            "selection": selection,
            "answers": None if answers is None else {int(row): answers[int(row)] for row in chosen},
            "drafts": drafts,
            "fmt": config.format,
            "answer_kind": config.answers,
            "answer_model": config.model if config.answers == "self" else None,
            "tokenizer": tokenizer,
            "family": _prompt_family(config, tokenizer),
            "frame": config.generation.completion_frame,
        },
        new_fingerprint=_key("expand", split, config.seed, len(chosen)),
        cache_file_name=str(work / f"pairs-{split}.arrow"),
        load_from_cache_file=False,
        desc=f"pairs ({split})",
    )
    report.splits[split] = {"requests": int(has_answer(analysed, chosen, answers).sum()), "rows": len(expanded)}
    return _finish_split(expanded, config, report, split)


def _finish_split(expanded: Dataset, config: BuildConfig, report: Report, split: str) -> Dataset:
    """Move token counts into the report and give the split a content-derived fingerprint."""
    stats = [c for c in STAT_COLUMNS if c in expanded.column_names]
    if stats:
        report.tokens.setdefault("splits", {})[split] = {
            c.strip("_"): length_stats(column(expanded, c)) for c in stats
        }
        expanded = expanded.remove_columns(stats)
    # The cache file's path would enter the fingerprint; the inputs and config identify the data.
    fingerprint = _key("split", split, asdict(config), report.inputs)
    return Dataset(expanded.data, info=DatasetInfo(features=expanded.features), split=split, fingerprint=fingerprint)


def command_line(argv: list[str]) -> str:
    """The command line that runs this build, for the dataset card.

    Args:
        argv (list[str]): the command's arguments.
    """
    return " ".join(["python -m data_builders", *argv]) if argv else "python -m data_builders"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m data_builders`; returns the exit status.

    Args:
        argv (list[str] | None): the command's arguments; None: the process's.
    """
    from headstart.config import cli_main, load_config, report_interrupt

    argv = list(sys.argv[1:] if argv is None else argv)

    def run() -> None:
        output = build(load_config(BuildConfig, argv), command_line(argv))
        print(f"saved {output}")
        print((output / "README.md").read_text().split("## Inputs")[0].rstrip())

    try:  # a Ctrl-C during the build says what it kept (BuildInterrupted's text), before it: nothing
        return cli_main(run, kept=NOTHING_KEPT)
    except KeyboardInterrupt:  # before cli_main took over Ctrl-C
        return report_interrupt(NOTHING_KEPT)
