"""Two sides compared over the same requests (PROTOCOL.md, "What every report shows"):
per-request differences of residual forwards, a paired bootstrap 95% interval for each
change, and a Wilcoxon signed-rank and a sign test of residual forwards.

The bootstrap is numpy's, not scipy.stats.bootstrap: one matrix of resampled request
indices serves both sides and every statistic (so the changes of one report come from the
same resamples), medians stay exact on integer counts, and a degenerate sample (identical
sides) gives the interval [0, 0] without scipy's degenerate-data warnings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from eval.reporting.metrics import is_answered, is_skipped
from eval.reporting.tables import markdown_rows

SAMPLES = 2000  # bootstrap resamples
SEED = 0
NO_CHANGE = "no measurable change"
BASE_SIDE = "before"


@dataclass(frozen=True)
class Change:
    """One paired change (after - before) with its bootstrap 95% percentile interval."""

    before: float
    after: float
    estimate: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """'lower' or 'higher' when the 95% interval excludes zero, else no measurable change."""
        return "lower" if self.high < 0 else "higher" if self.low > 0 else NO_CHANGE


@dataclass(frozen=True)
class PairedComparison:
    """Everything a report says about one side against the base over their common requests."""

    requests: int  # answered on both sides (metrics.summarize's rule on each side)
    wall_requests: int  # of those, timed on both sides
    quality_requests: int  # of those, executed (not skipped) on both sides
    differences: dict[str, float]  # request_id -> residual forwards after - before
    changes: dict[str, Change]
    lower: int
    equal: int
    higher: int
    wilcoxon_p: float | None  # None: no request answered on both sides
    sign_p: float | None

    def to_dict(self) -> dict[str, Any]:
        """Plain numbers for summary.json, each change with its verdict."""
        plain = asdict(self)
        plain["changes"] = {name: asdict(c) | {"verdict": c.verdict} for name, c in self.changes.items()}
        return plain


def timed(record: dict[str, Any]) -> bool:
    """Wall clock measured (a counted-only request carries None seconds).

    Args:
        record (dict[str, Any]): a per-request record.
    """
    return record.get("baseline_seconds") is not None and record.get("residual_seconds") is not None


def pair_records(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """(before, after) records of the requests present and answered on both sides, in before's order.

    Args:
        before (list[dict[str, Any]]): the base side's records.
        after (list[dict[str, Any]]): the other side's records.
    """
    after_by_id = {r["request_id"]: r for r in after}
    return [(b, after_by_id[b["request_id"]]) for b in before
            if b["request_id"] in after_by_id and is_answered(b) and is_answered(after_by_id[b["request_id"]])]


def resample_indices(n: int, samples: int = SAMPLES, seed: int = SEED) -> np.ndarray:
    """(samples, n) request indices drawn with replacement, the same for both sides.

    Args:
        n (int): how many requests there are.
        samples (int): how many bootstrap samples to draw.
        seed (int): the random seed.
    """
    return np.random.default_rng(seed).integers(0, n, size=(samples, n))


def median(values: np.ndarray) -> np.ndarray:
    """Median over the last axis.

    Args:
        values (np.ndarray): the values.
    """
    return np.median(values, axis=-1)


def mean(values: np.ndarray) -> np.ndarray:
    """Mean over the last axis.

    Args:
        values (np.ndarray): the values.
    """
    return np.mean(values, axis=-1)


def mean_present(values: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the non-NaN values; 0 where none (summarize's draft_kept_mean).

    Args:
        values (np.ndarray): the values, NaN where absent.
    """
    present = ~np.isnan(values)
    return np.nansum(values, axis=-1) / np.maximum(present.sum(axis=-1), 1)


def bootstrap_change(before: np.ndarray, after: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray],
                     indices: np.ndarray, relative: bool = False) -> Change:
    """statistic(after) - statistic(before) (or their ratio - 1), with its percentile interval.

    Args:
        before (np.ndarray): the base side's per-request values.
        after (np.ndarray): the other side's, request for request.
        statistic (Callable[[np.ndarray], np.ndarray]): what is compared: median, mean or mean_present over the last
            axis.
        indices (np.ndarray): the bootstrap samples' request indices (`resample_indices`).
        relative (bool): report the ratio less one instead of the difference.
    """
    def change(b, a):
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / b - 1 if relative else a - b

    point_before, point_after = float(statistic(before)), float(statistic(after))
    boot = change(statistic(before[indices]), statistic(after[indices]))
    low, high = np.percentile(boot, [2.5, 97.5])
    return Change(point_before, point_after, float(change(point_before, point_after)), float(low), float(high))


def _column(pairs: list[tuple[dict, dict]], value: Callable[[dict], float]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([value(b) for b, _ in pairs], dtype=float), np.array([value(a) for _, a in pairs], dtype=float))


def _kept(record: dict) -> float:
    return record["accepted_tokens"] / record["draft_tokens"] if record["draft_tokens"] else np.nan


def paired_changes(pairs: list[tuple[dict, dict]], samples: int = SAMPLES, seed: int = SEED) -> dict[str, Change]:
    """Every reported change over `pairs`; wall clock over the timed pairs, pass@1 over the executed.

    Args:
        pairs (list[tuple[dict, dict]]): the (before, after) records of each request.
        samples (int): how many bootstrap samples to draw.
        seed (int): the random seed.
    """
    indices = resample_indices(len(pairs), samples, seed)
    forwards = _column(pairs, lambda r: r["residual_forwards"])
    changes = {
        "forwards_stream_median": bootstrap_change(*forwards, median, indices),
        "forwards_stream_median_relative": bootstrap_change(*forwards, median, indices, relative=True),
        "speedup_forwards_median": bootstrap_change(
            *_column(pairs, lambda r: r["baseline_forwards"] / r["residual_forwards"]), median, indices),
        "draft_kept_mean": bootstrap_change(*_column(pairs, _kept), mean_present, indices),
        "single_forward_share": bootstrap_change(*_column(pairs, lambda r: r["residual_forwards"] == 1), mean, indices),
    }
    wall = [(b, a) for b, a in pairs if timed(b) and timed(a)]
    if wall:
        changes["speedup_wall_median"] = bootstrap_change(
            *_column(wall, lambda r: r["baseline_seconds"] / r["residual_seconds"]), median,
            resample_indices(len(wall), samples, seed))
    scored = [(b, a) for b, a in pairs if not is_skipped(b) and not is_skipped(a)]
    if scored:
        changes["quality_stream"] = bootstrap_change(*_column(scored, lambda r: r["stream_score"]), mean,
                                                     resample_indices(len(scored), samples, seed))
    return changes


def paired_tests(differences: np.ndarray) -> tuple[float, float]:
    """(Wilcoxon signed-rank p, sign test p) of the differences; zero differences are dropped
    by both (zero_method="wilcox", so the two tests read the same requests); p = 1 when all are zero.

    Args:
        differences (np.ndarray): the per-request differences, after less before.
    """
    from scipy import stats  # here: the report's only scipy use, not for `--help`

    nonzero = differences[differences != 0]
    if not nonzero.size:
        return 1.0, 1.0
    wilcoxon = stats.wilcoxon(nonzero, zero_method="wilcox").pvalue
    sign = stats.binomtest(int((nonzero < 0).sum()), int(nonzero.size), 0.5).pvalue
    return float(wilcoxon), float(sign)


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]], samples: int = SAMPLES,
            seed: int = SEED) -> PairedComparison:
    """`after` against `before` over the requests both answered.

    Args:
        before (list[dict[str, Any]]): the base side's records.
        after (list[dict[str, Any]]): the other side's records.
        samples (int): how many bootstrap samples to draw.
        seed (int): the random seed.
    """
    pairs = pair_records(before, after)
    differences = np.array([a["residual_forwards"] - b["residual_forwards"] for b, a in pairs], dtype=float)
    wilcoxon_p, sign_p = paired_tests(differences) if pairs else (None, None)
    return PairedComparison(
        requests=len(pairs),
        wall_requests=sum(timed(b) and timed(a) for b, a in pairs),
        quality_requests=sum(not is_skipped(b) and not is_skipped(a) for b, a in pairs),
        differences={b["request_id"]: float(d) for (b, _), d in zip(pairs, differences)},
        changes=paired_changes(pairs, samples, seed) if pairs else {},
        lower=int((differences < 0).sum()), equal=int((differences == 0).sum()), higher=int((differences > 0).sum()),
        wilcoxon_p=wilcoxon_p, sign_p=sign_p,
    )


def compare_sides(records: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, PairedComparison]]:
    """comparisons[benchmark][side]: every side but the base against the base ('before').

    Args:
        records (dict[str, dict[str, list[dict[str, Any]]]]): records[benchmark][side], the base side named 'before'.
    """
    return {benchmark: {side: compare(sides[BASE_SIDE], rows) for side, rows in sides.items() if side != BASE_SIDE}
            for benchmark, sides in records.items()}


def _points(value: float) -> str:
    return f"{100 * value:+.1f} pp"


# Change name -> (row label, value format, change format); shares change in percentage points.
ROWS: dict[str, tuple[str, Callable[[float], str], Callable[[float], str]]] = {
    "forwards_stream_median": ("median residual forwards", "{:g}".format, "{:+g}".format),
    "forwards_stream_median_relative": ("median residual forwards, relative", "{:g}".format, "{:+.1%}".format),
    "speedup_forwards_median": ("median speedup (forwards)", "{:.2f}x".format, "{:+.2f}x".format),
    "speedup_wall_median": ("median speedup (wall clock)", "{:.2f}x".format, "{:+.2f}x".format),
    "draft_kept_mean": ("draft kept", "{:.1%}".format, _points),
    "single_forward_share": ("one-forward share", "{:.1%}".format, _points),
    "quality_stream": ("pass@1 (stream)", "{:.1%}".format, _points),
}


def paired_rows(comparison: PairedComparison, side: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows): each change with its 95% interval and verdict.

    Args:
        comparison (PairedComparison): one side's comparison with the base.
        side (str): the side's name, for the labels.
    """
    rows = []
    for name in (name for name in ROWS if name in comparison.changes):  # ROWS' order, whatever the computation's
        change, (label, value, delta) = comparison.changes[name], ROWS[name]
        rows.append([label, value(change.before), value(change.after),
                     f"{delta(change.estimate)} [{delta(change.low)}, {delta(change.high)}]", change.verdict])
    return ["change", BASE_SIDE, side, "change (95% interval)", "verdict"], rows


def paired_note(comparison: PairedComparison, side: str) -> str:
    """The paired tests of residual forwards and the requests each row is over, in one sentence.

    Args:
        comparison (PairedComparison): one side's comparison with the base.
        side (str): the side's name.
    """
    if not comparison.requests:
        return f"No request was answered on both sides ({side} and {BASE_SIDE}): nothing to pair."
    return (f"Residual forwards per request ({side} - {BASE_SIDE}) over {comparison.requests} requests answered on both "
            f"sides: {comparison.lower} lower, {comparison.equal} equal, {comparison.higher} higher; Wilcoxon "
            f"signed-rank p = {comparison.wilcoxon_p:.3g}, sign test p = {comparison.sign_p:.3g} (equal requests "
            f"dropped by both). Wall clock paired over {comparison.wall_requests} timed requests, pass@1 over "
            f"{comparison.quality_requests} executed. Intervals: paired bootstrap, {SAMPLES} resamples, seed {SEED}.")


def paired_markdown(comparisons: dict[str, dict[str, PairedComparison]], names: dict[str, str] | None = None) -> list[str]:
    """Markdown lines: a 'Paired changes' table per benchmark and side; `names` labels sides (e.g. after -> sft).

    Args:
        comparisons (dict[str, dict[str, PairedComparison]]): comparisons[benchmark][side] (`compare_sides`).
        names (dict[str, str] | None): a label per side name, or None to use the names.
    """
    lines = []
    for benchmark, sides in comparisons.items():
        for side, comparison in sides.items():
            label = (names or {}).get(side, side)
            lines += [f"## Paired changes: {benchmark}, {label} vs {BASE_SIDE}\n",
                      markdown_rows(*paired_rows(comparison, label)), "", paired_note(comparison, label), ""]
    return lines
