"""Per-request records -> every column PROTOCOL.md asks a report to show."""

from __future__ import annotations

import statistics
from typing import Any


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate results; requests where either side answered nothing are excluded
    from every column alike."""
    valid = [r for r in records if r["base_answer"].strip() and r["stream_answer"].strip()]
    summary: dict[str, Any] = {"requests": len(records), "excluded_empty": len(records) - len(valid), "evaluated": len(valid)}
    if not valid:
        return summary
    speedup_forwards = [r["baseline_forwards"] / r["residual_forwards"] for r in valid]
    speedup_wall = [r["baseline_seconds"] / r["residual_seconds"] for r in valid]
    kept = [r["accepted_tokens"] / r["draft_tokens"] for r in valid if r["draft_tokens"]]
    summary.update(
        quality_base=_mean(r["base_score"] for r in valid),
        quality_stream=_mean(r["stream_score"] for r in valid),
        forwards_base_median=statistics.median(r["baseline_forwards"] for r in valid),
        forwards_stream_median=statistics.median(r["residual_forwards"] for r in valid),
        speedup_forwards_mean=_mean(speedup_forwards),
        speedup_forwards_median=statistics.median(speedup_forwards),
        speedup_wall_mean=_mean(speedup_wall),
        speedup_wall_median=statistics.median(speedup_wall),
        acceptance_none=_mean(r["accepted_tokens"] == 0 for r in valid),
        acceptance_all=_mean(r["accepted_tokens"] == r["draft_tokens"] > 0 for r in valid),
        draft_kept_mean=_mean(kept) if kept else 0.0,
        single_forward_share=_mean(r["residual_forwards"] == 1 for r in valid),
        total_cost_mean=_mean((r["drafting_forwards"] + r["residual_forwards"]) / r["baseline_forwards"] for r in valid),
        identical_to_baseline=_mean(r["identical"] for r in valid),
    )
    summary["acceptance_partial"] = 1.0 - summary["acceptance_none"] - summary["acceptance_all"]
    for name, values in (("forwards", speedup_forwards), ("wall", speedup_wall)):
        for bound in (1.0, 0.9, 0.8):
            summary[f"below_{bound:g}x_{name}"] = _mean(v < bound for v in values)
    return summary


def running_medians(records: list[dict[str, Any]]) -> dict[str, str]:
    """Short live figures for the progress bar."""
    if not records:
        return {}
    return {
        "speedup": f"{statistics.median(r['baseline_forwards'] / r['residual_forwards'] for r in records):.2f}x",
        "residual": f"{statistics.median(r['residual_forwards'] for r in records):g}",
    }


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0
