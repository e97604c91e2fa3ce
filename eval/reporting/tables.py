"""Render summaries as the Markdown table every report shows (PROTOCOL.md)."""

from __future__ import annotations

from typing import Any

from eval.reporting.metrics import identity_phrase

# A column whose cell is a phrase built from several keys, not one formatted value.
PHRASES = {"identity": identity_phrase}
# (header, summary key, format); pass rates and shares are percentages.
COLUMNS = [
    ("n", "evaluated", "{:g}"),
    # Requests with a degenerate answer (eval/evaluation/degenerate.py), counted over all requests.
    ("degenerate base/stream", ("degenerate_base", "degenerate_stream"), "{:g}/{:g}"),
    ("timed", "timed", "{:g}"),  # requests with wall clock (all but in count mode, EvalConfig.timed_every)
    ("quality base", "quality_base", "{:.1%}"),
    ("quality stream", "quality_stream", "{:.1%}"),
    # Compared token for token with a baseline decoded apart; count mode's counted requests are not.
    ("identical", "identity", ""),
    ("fwd base (med)", "forwards_base_median", "{:g}"),
    ("fwd stream (med)", "forwards_stream_median", "{:g}"),
    ("speedup fwd mean", "speedup_forwards_mean", "{:.2f}x"),
    ("speedup fwd med", "speedup_forwards_median", "{:.2f}x"),
    # The least a residual can cost, the median speedup a request at that floor would have, and the
    # share of it the median speedup reaches (eval.reporting.metrics.floor_bound).
    ("floor / bound / share", ("residual_floor", "floor_bound_median", "floor_bound_share"), "{:g}/{:.2f}x/{:.0%}"),
    ("speedup wall mean", "speedup_wall_mean", "{:.2f}x"),
    ("speedup wall med", "speedup_wall_median", "{:.2f}x"),
    ("fwd lookup base (med)", "forwards_lookup_base_median", "{:g}"),
    ("vs lookup fwd mean/med", ("speedup_lookup_forwards_mean", "speedup_lookup_forwards_median"), "{:.2f}x/{:.2f}x"),
    ("vs lookup wall mean/med", ("speedup_lookup_wall_mean", "speedup_lookup_wall_median"), "{:.2f}x/{:.2f}x"),
    ("<1x fwd/wall", ("below_1x_forwards", "below_1x_wall"), "{:.0%}/{:.0%}"),
    ("<0.9x fwd/wall", ("below_0.9x_forwards", "below_0.9x_wall"), "{:.0%}/{:.0%}"),
    ("<0.8x fwd/wall", ("below_0.8x_forwards", "below_0.8x_wall"), "{:.0%}/{:.0%}"),
    ("accept none/partial/all", ("acceptance_none", "acceptance_partial", "acceptance_all"), "{:.0%}/{:.0%}/{:.0%}"),
    ("draft kept", "draft_kept_mean", "{:.1%}"),
    ("1-forward", "single_forward_share", "{:.1%}"),
    ("total cost", "total_cost_mean", "{:.2f}x"),
]


def markdown_rows(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table from already formatted cells.

    Args:
        header (list[str]): the column names.
        rows (list[list[str]]): the rows' formatted cells.
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def markdown_table(summaries: dict[str, dict[str, Any]]) -> str:
    """One row per benchmark (and a pooled row when the caller adds one).

    Args:
        summaries (dict[str, dict[str, Any]]): each benchmark's summary.
    """
    header = ["benchmark"] + [name for name, _, _ in COLUMNS]
    rows = [[benchmark] + [_cell(summary, key, fmt) for _, key, fmt in COLUMNS] for benchmark, summary in summaries.items()]
    return markdown_rows(header, rows)


def _cell(summary: dict[str, Any], key, fmt: str) -> str:
    """One cell; a cell of several values ("a/b") shows "-" for each one the summary lacks
    (wall clock, when no request of a count-mode run was timed)."""
    if key in PHRASES:
        return PHRASES[key](summary)
    keys = key if isinstance(key, tuple) else (key,)
    if all(k not in summary for k in keys):
        return "-"
    parts = fmt.split("/") if len(keys) > 1 else [fmt]
    return "/".join(part.format(summary[k]) if k in summary else "-" for k, part in zip(keys, parts))


# Table 1: what streaming does to answer quality (per benchmark, macro average).
QUALITY_COLUMNS = [
    ("n", "evaluated", "{:g}"),
    ("skipped", "skipped", "{:g}"),
    ("quality base", "quality_base", "{:.1%}"),
    ("quality stream", "quality_stream", "{:.1%}"),
    ("delta", "quality_delta", "{:+.1%}"),
    ("identical answers", "identity", ""),
    ("agreement F1", "agreement_f1", "{:.1%}"),
    ("degenerate base/stream", ("degenerate_base", "degenerate_stream"), "{:g}/{:g}"),
]
# Summary keys that are counts: the macro row sums them instead of averaging.
COUNT_KEYS = ("requests", "excluded_empty", "evaluated", "skipped", "quality_evaluated", "timed", "identical_measured",
              "counted", "drafter_compared", "degenerate_base", "degenerate_stream", "degenerate_unchecked")
ALL_OR_NONE_KEYS = ("degenerate_base", "degenerate_stream")


def macro_average(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Unweighted mean over benchmarks of every numeric column (counts summed);
    a column missing from a benchmark is averaged over those that have it.

    Args:
        summaries (dict[str, dict[str, Any]]): each benchmark's summary.
    """
    keys = {k for s in summaries.values() for k, v in s.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    # A degenerate count is a count over all requests: summed only when every benchmark has one.
    keys -= {k for k in ALL_OR_NONE_KEYS if any(k not in s for s in summaries.values())}
    macro: dict[str, Any] = {}
    for key in sorted(keys):
        values = [s[key] for s in summaries.values() if isinstance(s.get(key), (int, float))]
        macro[key] = sum(values) if key in COUNT_KEYS else sum(values) / len(values)
    return macro


def with_quality_delta(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with `quality_delta` (streamed less base quality) added when it has both.

    Args:
        summary (dict[str, Any]): a benchmark's summary.
    """
    if "quality_base" in summary and "quality_stream" in summary:
        return summary | {"quality_delta": summary["quality_stream"] - summary["quality_base"]}
    return summary


def quality_table(summaries: dict[str, dict[str, Any]], metrics: dict[str, str]) -> str:
    """Table 1 layout: one row per benchmark (with its metric), then the macro average.

    Args:
        summaries (dict[str, dict[str, Any]]): each benchmark's summary.
        metrics (dict[str, str]): each benchmark's quality metric's name.
    """
    header = ["benchmark", "metric"] + [name for name, _, _ in QUALITY_COLUMNS]
    rows = [[name, metrics.get(name, "")] + [_cell(with_quality_delta(summary), key, fmt) for _, key, fmt in QUALITY_COLUMNS]
            for name, summary in summaries.items()]
    return markdown_rows(header, rows)


def suite_report(by_rule: dict[str, dict[str, dict[str, Any]]], metrics: dict[str, str], title: str) -> str:
    """The suite's report: per acceptance rule, Table 1 (quality) and Table 2
    (the PROTOCOL.md columns), each ending in the macro average over benchmarks.

    Args:
        by_rule (dict[str, dict[str, dict[str, Any]]]): by_rule[acceptance rule][benchmark]: the benchmark's summary.
        metrics (dict[str, str]): each benchmark's quality metric's name.
        title (str): the report's title.
    """
    parts = [f"# {title}"]
    for rule, summaries in by_rule.items():
        rows = dict(summaries) | {"macro average": macro_average(summaries)}
        parts += [
            f"## acceptance `{rule}`",
            "### Table 1: quality (pass@1 or token F1; skipped problems left out)",
            quality_table(rows, metrics),
            "### Table 2: streaming cost and speedup (medians of forwards; shares of requests)",
            markdown_table(rows),
        ]
    return "\n\n".join(parts) + "\n"
