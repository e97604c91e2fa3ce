"""What adaptation bought: the base and the adapted model on the same suite.

    python -m eval.before_after recipe=before_after_smollm2 adapted=outputs/train/smollm2_prefix/adapter

Both models run with identical settings through `run_evaluation` (per-request
results are reused, so a rerun computes only what is missing), then one report
is written: Markdown and HTML with Table 1/2/3 layouts, speedup histograms and
acceptance bars (PNG), and a W&B group holding a run per side.
"""

from __future__ import annotations

import html
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.benchmarks import BENCHMARKS
from eval.engines.decode import decode_label
from eval.evaluation.config import EvalConfig, EvaluationSettings, check_limit
from eval.reporting.tables import macro_average, markdown_rows, markdown_table
from eval.reporting.typing_report import TYPING_NOTE, TYPING_TITLE, break_even_notes, typing_rows, typing_section
from eval.reporting.wandb_report import log_side
from headstart.config import config_to_dict, dump_config, run_cli
from headstart.files import read_jsonl
from headstart.paths import outputs_dir
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM, check_evaluation_system_setting, resolve_system_message
from headstart.run_config import SystemPromptSetting
from headstart.run_dir import check_output_dir, write_mark

if TYPE_CHECKING:
    from eval.evaluation.runner import PreparedRun
    from eval.reporting.paired import PairedComparison

KIND = "before-after"


@dataclass
class BeforeAfterConfig(SystemPromptSetting, EvaluationSettings):
    """Evaluate a base model (`model`) and its adaptation with identical settings. One system message on
    every side: `system_prompt=model` is what the adapted model (`adapted`) records (`shared_system_setting`)."""

    adapted: str = field(
        default=str(outputs_dir("train", "smollm2_prefix", "adapter")),
        metadata={"help": "Adapted model: LoRA adapter dir or merged model dir."},
    )
    more_adapted: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "Further adapted models, side name -> dir (e.g. {distill: <adapter>}); each adds a side to every "
                          "table."},
    )
    benchmarks: list[str] = field(default_factory=lambda: ["humaneval"], metadata={"help": "Benchmarks to run on both sides."})
    limit: int | None = field(
        default=10,
        metadata={"help": "Requests per benchmark (first N with n >= 2); null: all; 0: check only (both sides' settings, data, "
                          "models, output dirs), evaluate and write nothing."},
    )
    output_dir: str = field(
        default=str(outputs_dir("before_after", "smollm2")),
        metadata={"help": "Report, figures, per-side results."},
    )
    wandb_project: str | None = field(default=None, metadata={"help": "W&B project; unset = offline run under output_dir."})
    wandb_group: str | None = field(default=None, metadata={"help": "W&B group linking both runs; default the output dir name."})

    def __post_init__(self) -> None:
        check_limit(self.limit)
        unknown = sorted((set(self.benchmarks) | set(self.data_paths)) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"benchmarks or data_paths name {unknown}, not benchmarks ({', '.join(sorted(BENCHMARKS))})")
        self.system_prompt = check_evaluation_system_setting(self.system_prompt)
        super().__post_init__()
        for name in self.more_adapted:
            if name in ("before", "after") or not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"more_adapted: side name {name!r} must be a plain name other than before/after")

    @property
    def sides(self) -> dict[str, str]:
        """Side name -> model, in report order: the base first."""
        return {"before": self.model, "after": self.adapted, **self.more_adapted}


def shared_system_setting(config: BeforeAfterConfig) -> str:
    """The system setting every side is evaluated with: `model` reads the adapted model's training record
    (the base has none), so both sides get the message the adaptation was trained with and the
    comparison stays one of weights.

    Args:
        config (BeforeAfterConfig): the before/after settings.
    """
    if config.system_prompt != "model":
        return config.system_prompt
    text = resolve_system_message("model", config.adapted)
    return "none" if text is None else "incomplete" if text == INCOMPLETE_REQUEST_SYSTEM else text


def side_config(config: BeforeAfterConfig, side: str, benchmark: str) -> EvalConfig:
    """The evaluation of one side on one benchmark; everything but the model is shared.

    Args:
        config (BeforeAfterConfig): the before/after settings.
        side (str): the side's name (`before`, `after` or a `more_adapted` name).
        benchmark (str): the benchmark's name.
    """
    return EvalConfig(
        model=config.sides[side],
        benchmark=benchmark,
        data_path=config.data_paths.get(benchmark),
        limit=config.limit,
        decode=config.decode,
        system_prompt=shared_system_setting(config),
        timed_every=config.timed_every,
        backend=config.backend,
        fast_batch_size=config.fast_batch_size,
        device=config.device,
        dtype=config.dtype,
        typing=config.typing,
        typing_policy=config.typing_policy,
        output_dir=str(Path(config.output_dir) / side / benchmark),
        shard=config.shard,
    )


def run_before_after(config: BeforeAfterConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """Evaluate every side, write the report; returns summaries[benchmark][side].
    Every side is checked first (data, base and adapted weights, results already in
    output_dir: a retrained adapter at the same path is refused, not reused), so a
    bad setting fails before any model loads or any file is written.

    Args:
        config (BeforeAfterConfig): the before/after settings.
    """
    from eval.evaluation.runner import prepare_evaluation, run_evaluation  # here, not above: `--help` loads no torch
    from eval.reporting.paired import compare_sides  # numpy, scipy: not for `--help`

    output_dir = Path(config.output_dir)
    unknown = set(config.data_paths) - set(config.benchmarks)
    if unknown:
        raise ValueError(f"data_paths names benchmarks not in benchmarks: {', '.join(sorted(unknown))}")
    check_output_dir(output_dir, KIND)
    prepared = {(side, benchmark): prepare_evaluation(side_config(config, side, benchmark))
                for side in config.sides for benchmark in config.benchmarks}
    if config.limit == 0:
        print(f"limit=0: every side of {', '.join(config.benchmarks)} checked; nothing evaluated, nothing written")
        return {}
    write_mark(output_dir, KIND)
    if config.shard:
        return run_shard(config, prepared)
    output_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, output_dir / "config.yaml")
    summaries: dict[str, dict[str, dict[str, Any]]] = {b: {} for b in config.benchmarks}
    records: dict[str, dict[str, list[dict[str, Any]]]] = {b: {} for b in config.benchmarks}
    for side in config.sides:
        for benchmark in config.benchmarks:
            evaluation = side_config(config, side, benchmark)
            summaries[benchmark][side] = run_evaluation(evaluation, prepared=prepared[side, benchmark])
            records[benchmark][side] = read_jsonl(Path(evaluation.output_dir) / "results.jsonl")
    paired = compare_sides(records)
    figures = write_figures(summaries, records, output_dir / "figures", paired)
    typing = side_typing(config) if config.typing else {}
    figures += typing_figures(typing, output_dir / "figures")
    write_reports(config, summaries, figures, output_dir, typing, paired)
    for side in config.sides:
        log_side(config, side, summaries, records, figures, config_to_dict(config), paired)
    print(f"\nreport: {output_dir / 'report.md'}\n        {output_dir / 'report.html'}")
    return summaries


def run_shard(config: BeforeAfterConfig,
              prepared: dict[tuple[str, str], PreparedRun] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """One shard of every side and benchmark, each into its own shards/ directory; the
    report (and the W&B runs) come from the run without shard, which merges the shards.
    Nothing else is written, so that shards running at once never share a file.

    Args:
        config (BeforeAfterConfig): the before/after settings, with `shard` set.
        prepared (dict[tuple[str, str], PreparedRun] | None): (side, benchmark) -> its run as
            `run_before_after` checked it; None: checked here.
    """
    from eval.evaluation.runner import run_evaluation  # here, not above: `--help` loads no torch

    summaries: dict[str, dict[str, dict[str, Any]]] = {b: {} for b in config.benchmarks}
    for side in config.sides:
        for benchmark in config.benchmarks:
            summaries[benchmark][side] = run_evaluation(side_config(config, side, benchmark),
                                                        prepared=(prepared or {}).get((side, benchmark)))
    print(f"\nshard {config.shard} done; the same command without shard merges the shards and writes the report")
    return summaries


def write_figures(summaries, records, directory: Path,
                  paired: dict[str, dict[str, PairedComparison]] | None = None) -> list[Path]:
    """Speedup histograms, acceptance bars and, with `paired`, the per-request paired differences.

    Args:
        summaries (dict[str, dict[str, dict[str, Any]]]): summaries[benchmark][side].
        records (dict[str, dict[str, list[dict[str, Any]]]]): records[benchmark][side], each side's results.jsonl.
        directory (Path): where the PNG files go.
        paired (dict[str, dict[str, PairedComparison]] | None): paired[benchmark][side], each side against
            the base; None: no paired figure.
    """
    from eval.reporting.plots import acceptance_bars, paired_differences, speedup_histogram  # matplotlib: not for `--help`

    figures = [
        speedup_histogram(records[benchmark], f"{benchmark}: residual speedup", directory / f"speedup_{benchmark}.png")
        for benchmark in summaries
    ]
    figures.append(acceptance_bars(summaries, directory / "acceptance.png"))
    if paired:
        differences = {b: {side: list(c.differences.values()) for side, c in sides.items()} for b, sides in paired.items()}
        figures.append(paired_differences(differences, directory / "paired_differences.png"))
    return figures


def report_tables(summaries: dict[str, dict[str, dict[str, Any]]]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Table 1 (quality), 2 (speedup), 3 (acceptance), with a macro-average row.

    Args:
        summaries (dict[str, dict[str, dict[str, Any]]]): summaries[benchmark][side].
    """
    rows = dict(summaries)
    if len(rows) > 1:
        sides = next(iter(summaries.values()))
        rows["macro average"] = {side: macro_average({b: s[side] for b, s in summaries.items()}) for side in sides}

    def arrow(by_side, key, fmt):
        return " → ".join(_fmt(summary.get(key), fmt) for summary in by_side.values())

    table1 = (["benchmark", "quality base", "quality stream"],
              [[b, arrow(s, "quality_base", "{:.1%}"), arrow(s, "quality_stream", "{:.1%}")] for b, s in rows.items()])
    table2 = (["benchmark", "median speedup (fwd)", "mean speedup (fwd)", "median speedup (wall)", "mean speedup (wall)",
               "residual fwd (median)", "median vs lookup baseline (fwd)"],
              [[b, arrow(s, "speedup_forwards_median", "{:.2f}x"), arrow(s, "speedup_forwards_mean", "{:.2f}x"),
                arrow(s, "speedup_wall_median", "{:.2f}x"), arrow(s, "speedup_wall_mean", "{:.2f}x"),
                arrow(s, "forwards_stream_median", "{:g}"), arrow(s, "speedup_lookup_forwards_median", "{:.2f}x")]
               for b, s in rows.items()])
    table3 = (["benchmark", "draft kept", "1-forward share", "accept none", "accept partial", "accept all"],
              [[b, arrow(s, "draft_kept_mean", "{:.1%}"), arrow(s, "single_forward_share", "{:.1%}"),
                arrow(s, "acceptance_none", "{:.0%}"), arrow(s, "acceptance_partial", "{:.0%}"),
                arrow(s, "acceptance_all", "{:.0%}")] for b, s in rows.items()])
    order = " → ".join(next(iter(rows.values())))
    return {f"Table 1: quality ({order})": table1, f"Table 2: speedup ({order})": table2,
            f"Table 3: acceptance ({order})": table3}


def write_reports(config: BeforeAfterConfig, summaries, figures: list[Path], output_dir: Path, typing=None,
                  paired: dict[str, dict[str, PairedComparison]] | None = None) -> None:
    """report.md, report.html and summary.json (each side but the base with its paired_vs_before).

    Args:
        config (BeforeAfterConfig): the before/after settings.
        summaries (dict[str, dict[str, dict[str, Any]]]): summaries[benchmark][side].
        figures (list[Path]): the PNG files the reports show.
        output_dir (Path): where the reports go.
        typing (dict[str, dict[str, dict[str, Any]]] | None): typing[side][benchmark], from `side_typing`;
            None: no typing section.
        paired (dict[str, dict[str, PairedComparison]] | None): paired[benchmark][side], each side against
            the base; None: no paired section.
    """
    from eval.reporting.paired import BASE_SIDE, paired_markdown, paired_note, paired_rows  # numpy: not for `--help`

    tables = report_tables(summaries)
    paired = paired or {}
    models = " → ".join(f"{side} `{model}`" for side, model in config.sides.items())
    markdown = [f"# Before/after streaming report\n\n{models}, "
                f"{decode_label(config.decode)}, max_new_tokens {config.decode.max_new_tokens}, limit {config.limit}\n"]
    for title, (header, rows) in tables.items():
        markdown += [f"## {title}\n", markdown_rows(header, rows), ""]
    markdown += paired_markdown(paired)
    for side in config.sides:
        markdown += [f"## All columns, {side}\n", markdown_table({b: s[side] for b, s in summaries.items()}), ""]
    for side, by_benchmark in (typing or {}).items():
        markdown += [typing_section(by_benchmark).replace(f"## {TYPING_TITLE}", f"## {TYPING_TITLE}, {side}", 1)]
    markdown += [f"![{p.stem}](figures/{p.name})" for p in figures]
    (output_dir / "report.md").write_text("\n".join(markdown) + "\n")
    body = [f"<h1>Before/after streaming report</h1><p>{html.escape(markdown[0])}</p>"]
    for title, (header, rows) in tables.items():
        body += [f"<h2>{html.escape(title)}</h2>", _html(header, rows)]
    for benchmark, sides in paired.items():
        for side, comparison in sides.items():
            body += [f"<h2>Paired changes: {html.escape(benchmark)}, {html.escape(side)} vs {BASE_SIDE}</h2>",
                     _html(*paired_rows(comparison, side)), f"<p>{html.escape(paired_note(comparison, side))}</p>"]
    for side, by_benchmark in (typing or {}).items():
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in break_even_notes(by_benchmark))
        body += [f"<h2>{TYPING_TITLE}, {html.escape(side)}</h2><p>{TYPING_NOTE}</p>", _html(*typing_rows(by_benchmark)),
                 f"<ul>{notes}</ul>"]
    body += [f'<img src="figures/{p.name}" alt="{p.stem}">' for p in figures]
    (output_dir / "report.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>headstart before/after</title>"
        "<style>table{border-collapse:collapse}td,th{border:1px solid #999;padding:3px 8px}</style>"
        + "\n".join(body) + "\n")
    with_paired = {b: {side: summary | ({"paired_vs_before": paired[b][side].to_dict()} if side in paired.get(b, {}) else {})
                       for side, summary in sides.items()} for b, sides in summaries.items()}
    (output_dir / "summary.json").write_text(json.dumps(with_paired, indent=2) + "\n")


def side_typing(config: BeforeAfterConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """typing[side][benchmark]: each side's typing.json (written by run_evaluation).

    Args:
        config (BeforeAfterConfig): the before/after settings.
    """
    return {side: {b: json.loads((Path(side_config(config, side, b).output_dir) / "typing.json").read_text())[b]
                   for b in config.benchmarks} for side in config.sides}


def typing_figures(typing: dict[str, dict[str, dict[str, Any]]], directory: Path) -> list[Path]:
    """One time-to-answer against typing speed figure per side.

    Args:
        typing (dict[str, dict[str, dict[str, Any]]]): typing[side][benchmark], from `side_typing`.
        directory (Path): where the PNG files go.
    """
    from eval.reporting.plots import typing_curve  # matplotlib: not for `--help`

    return [typing_curve(by_benchmark, directory / f"typing_{side}.png") for side, by_benchmark in typing.items()]


def _fmt(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _html(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def main(argv: list[str] | None = None) -> int:
    """The command line's entry point; returns the exit code.

    Args:
        argv (list[str] | None): `recipe=NAME` and `key=value` overrides; None: `sys.argv[1:]`.
    """
    return run_cli(BeforeAfterConfig, run_before_after, argv)


if __name__ == "__main__":
    sys.exit(main())
