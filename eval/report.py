"""Render summaries as the Markdown table every report shows (PROTOCOL.md)."""

from __future__ import annotations

from typing import Any

# (header, summary key, format); pass rates and shares are percentages.
COLUMNS = [
    ("n", "evaluated", "{:g}"),
    ("quality base", "quality_base", "{:.1%}"),
    ("quality stream", "quality_stream", "{:.1%}"),
    ("fwd base (med)", "forwards_base_median", "{:g}"),
    ("fwd stream (med)", "forwards_stream_median", "{:g}"),
    ("speedup fwd mean", "speedup_forwards_mean", "{:.2f}x"),
    ("speedup fwd med", "speedup_forwards_median", "{:.2f}x"),
    ("speedup wall mean", "speedup_wall_mean", "{:.2f}x"),
    ("speedup wall med", "speedup_wall_median", "{:.2f}x"),
    ("<1x fwd/wall", ("below_1x_forwards", "below_1x_wall"), "{:.0%}/{:.0%}"),
    ("<0.9x fwd/wall", ("below_0.9x_forwards", "below_0.9x_wall"), "{:.0%}/{:.0%}"),
    ("<0.8x fwd/wall", ("below_0.8x_forwards", "below_0.8x_wall"), "{:.0%}/{:.0%}"),
    ("accept none/partial/all", ("acceptance_none", "acceptance_partial", "acceptance_all"), "{:.0%}/{:.0%}/{:.0%}"),
    ("draft kept", "draft_kept_mean", "{:.1%}"),
    ("1-forward", "single_forward_share", "{:.1%}"),
    ("total cost", "total_cost_mean", "{:.2f}x"),
]


def markdown_table(summaries: dict[str, dict[str, Any]]) -> str:
    """One row per benchmark (and a pooled row when the caller adds one)."""
    header = ["benchmark"] + [name for name, _, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for benchmark, summary in summaries.items():
        cells = [benchmark] + [_cell(summary, key, fmt) for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(summary: dict[str, Any], key, fmt: str) -> str:
    keys = key if isinstance(key, tuple) else (key,)
    if any(k not in summary for k in keys):
        return "-"
    return fmt.format(*(summary[k] for k in keys))
