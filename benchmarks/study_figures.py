"""Figures of the adaptation study (benchmarks/study_adaptation.py): the learning curve
and the residual forwards per benchmark, drawn like the before/after report's figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.reporting.plots import plt, save_figure, side_colors


def learning_curve(curves: dict[str, list[dict[str, float]]], title: str, path: Path) -> Path:
    """Median residual forwards and draft kept against training steps, one line per side;
    each point is {"step", "forwards_stream_median", "draft_kept_mean"} (step 0: the base)."""
    figure, (forwards, kept) = plt.subplots(1, 2, figsize=(9, 3.5))
    for (side, color), points in zip(side_colors(["base", *curves]), [[], *curves.values()]):
        if points:
            steps = [p["step"] for p in points]
            forwards.plot(steps, [p["forwards_stream_median"] for p in points], "o-", color=color, label=side)
            kept.plot(steps, [p["draft_kept_mean"] for p in points], "o-", color=color, label=side)
    forwards.set_ylabel("median residual forwards")
    kept.set_ylabel("draft tokens kept (mean share)")
    for axes in (forwards, kept):
        axes.set_xlabel("optimizer steps")
        axes.legend(fontsize="small")
    figure.suptitle(title)
    return save_figure(figure, path)


def residual_forwards_boxes(records: dict[str, dict[str, list[dict[str, Any]]]], path: Path) -> Path:
    """The distribution of residual forwards per benchmark and side (box plots, log scale)."""
    benchmarks = list(records)
    figure, panels = plt.subplots(1, len(benchmarks), figsize=(4.5 * len(benchmarks), 3.5), squeeze=False)
    for axes, benchmark in zip(panels[0], benchmarks):
        sides = list(records[benchmark])
        values = [[r["residual_forwards"] for r in records[benchmark][side]] for side in sides]
        boxes = axes.boxplot(values, tick_labels=sides, patch_artist=True)
        for box, (_, color) in zip(boxes["boxes"], side_colors(sides)):
            box.set_facecolor(color)
        axes.set_yscale("log")
        axes.set_title(benchmark)
        axes.set_ylabel("residual forwards")
    return save_figure(figure, path)
