"""Figures of a before/after report (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SIDE_COLORS = ("tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:purple")  # before, after, further sides


def side_colors(sides) -> list[tuple[str, str]]:
    """(side, color) in report order; the base is always grey.

    Args:
        sides: the sides' names, in report order, the base first.
    """
    return [(side, SIDE_COLORS[i % len(SIDE_COLORS)]) for i, side in enumerate(sides)]


def speedup_histogram(records: dict[str, list[dict[str, Any]]], title: str, path: Path) -> Path:
    """Per-request residual speedup (forwards), log-scale bins, every side overlaid.

    Args:
        records (dict[str, list[dict[str, Any]]]): each side's per-request records.
        title (str): the figure's title.
        path (Path): the PNG to write.
    """
    speedups = {side: [r["baseline_forwards"] / r["residual_forwards"] for r in rows] for side, rows in records.items()}
    values = [v for side in speedups.values() for v in side]
    top = max(values + [2.0])
    bins = np.logspace(np.log10(min(values + [1.0]) * 0.9), np.log10(top * 1.1), 25)
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for side, color in side_colors(speedups):
        if speedups[side]:
            axes.hist(speedups[side], bins=bins, alpha=0.6, color=color,
                      label=f"{side} (median {np.median(speedups[side]):.2f}x)")
    axes.set_xscale("log")
    axes.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_xlabel("residual speedup (baseline forwards / residual forwards)")
    axes.set_ylabel("requests")
    axes.set_title(title)
    axes.legend()
    return save_figure(figure, path)


def acceptance_bars(summaries: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    """Share of requests whose final draft was kept not at all / partly / wholly.

    Args:
        summaries (dict[str, dict[str, dict[str, Any]]]): summaries[benchmark][side].
        path (Path): the PNG to write.
    """
    benchmarks = list(summaries)
    sides = list(summaries[benchmarks[0]])
    kinds = ("acceptance_none", "acceptance_partial", "acceptance_all")
    figure, axes = plt.subplots(figsize=(max(5, 1.1 * len(sides) * len(benchmarks)), 3.5))
    width = 0.8 / len(sides)
    for offset, side in enumerate(sides):
        bottom = np.zeros(len(benchmarks))
        for kind, color in zip(kinds, ("tab:red", "tab:orange", "tab:green")):
            heights = np.array([summaries[b][side].get(kind, 0.0) for b in benchmarks])
            label = kind.split("_")[1] if offset == 0 else None
            axes.bar(np.arange(len(benchmarks)) + (offset - (len(sides) - 1) / 2) * width, heights, width * 0.95,
                     bottom=bottom, color=color, label=label, edgecolor="white")
            bottom += heights
    axes.set_xticks(np.arange(len(benchmarks)), [f"{b}\n{' | '.join(sides)}" for b in benchmarks])
    axes.set_ylabel("share of requests")
    axes.set_ylim(0, 1)
    axes.set_title("Final-draft acceptance")
    axes.legend(loc="upper right", fontsize="small")
    return save_figure(figure, path)


def save_figure(figure, path: Path) -> Path:
    """Write `figure` as a PNG at `path` (its folder made) and close it.

    Args:
        figure: the matplotlib figure.
        path (Path): the PNG to write.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def typing_curve(typing: dict[str, dict[str, Any]], path: Path) -> Path:
    """Median time-to-answer after Enter against typing speed, per benchmark: streamed
    (solid, cpm points; the unlimited typist as a dotted level) and baseline (dashed).

    Args:
        typing (dict[str, dict[str, Any]]): each benchmark's typing summary.
        path (Path): the PNG to write.
    """
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for index, (benchmark, summary) in enumerate(typing.items()):
        color = SIDE_COLORS[(index + 1) % len(SIDE_COLORS)]
        timed = [p for p in summary["curve"] if p["typist"].startswith("cpm:")]
        cpm = [float(p["typist"][4:]) for p in timed]
        axes.plot(cpm, [p["time_to_answer_median"] for p in timed], "o-", color=color, label=f"{benchmark} stream")
        axes.plot(cpm, [p["baseline_seconds_median"] for p in timed], "--", color=color, label=f"{benchmark} baseline")
        for point in summary["curve"]:
            if point["typist"] == "unlimited":
                axes.axhline(point["time_to_answer_median"], color=color, linestyle=":",
                             label=f"{benchmark} unlimited typist (sentence replay)")
    axes.set_xscale("log", base=2)
    from eval.evaluation.typing_sim import CURVE_CPM

    axes.set_xticks(list(CURVE_CPM), [str(c) for c in CURVE_CPM])
    axes.set_xlabel("typing speed (characters per minute)")
    axes.set_ylabel("median seconds after Enter")
    axes.set_ylim(bottom=0)
    axes.set_title(f"Time to answer while typing (policy {next(iter(typing.values()))['policy']})")
    axes.legend(fontsize="x-small")
    return save_figure(figure, path)


def paired_differences(differences: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """Per-request residual forwards of each adapted side minus the base's, one panel per
    benchmark: the differences sorted (x: share of requests), zero line, median dashed.

    Args:
        differences (dict[str, dict[str, list[float]]]): differences[benchmark][side], one value per request.
        path (Path): the PNG to write.
    """
    benchmarks = list(differences)
    figure, panels = plt.subplots(1, len(benchmarks), figsize=(4.5 * len(benchmarks), 3.5), squeeze=False)
    for axes, benchmark in zip(panels[0], benchmarks):
        sides = differences[benchmark]
        # colours as in every other figure: the base keeps grey, so the sides start at blue
        for side, color in side_colors(["before", *sides])[1:]:
            values = np.sort(np.asarray(sides[side], dtype=float))
            if not values.size:
                continue
            share = (np.arange(values.size) + 0.5) / values.size
            median = float(np.median(values))
            axes.bar(share, values, width=1 / values.size, color=color, alpha=0.6,
                     label=f"{side} - before (median {median:+g}; {int((values < 0).sum())} lower, "
                           f"{int((values > 0).sum())} higher)")
            axes.axhline(median, color=color, linestyle="--", linewidth=1)
        axes.axhline(0, color="black", linewidth=0.8)
        axes.set_xlim(0, 1)
        axes.set_xlabel("requests, sorted by difference (share)")
        axes.set_ylabel("residual forwards, side - before")
        axes.set_title(f"{benchmark}: paired differences")
        axes.legend(fontsize="x-small")
    return save_figure(figure, path)
