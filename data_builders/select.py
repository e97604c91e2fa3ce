"""Pass 3: drop ineligible requests in order, then choose requests under the caps.

Works on numpy columns (a few bytes per request), so 1M requests cost a few
megabytes. The order of the filters is the order of the card's funnel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from datasets import Dataset

from data_builders.analyse import CONTAMINATION_REASONS
from data_builders.config import BuildConfig
from data_builders.report import Report


@dataclass
class Selection:
    """Chosen requests (row numbers of the analysed dataset) and how many prefixes each keeps."""

    train: np.ndarray
    validation: np.ndarray
    per_request: int  # caps.max_pairs_per_request (0: all prefixes)
    last_row: int = -1  # the request that reached caps.max_pairs ...
    last_count: int = 0  # ... keeps only this many prefixes

    def prefixes(self, row: int, num_segments: int) -> list[int]:
        """Kept prefix indices i (1-based) of a chosen request.

        Args:
            row (int): the request's row number.
            num_segments (int): how many segments it has.
        """
        if row == self.last_row:
            return spaced_prefixes(num_segments, self.last_count)
        return spaced_prefixes(num_segments, self.per_request)

    def rows(self) -> np.ndarray:
        return np.concatenate([self.validation, self.train])


def column(dataset: Dataset, name: str) -> np.ndarray:
    """A column of the dataset as a NumPy array.

    Args:
        dataset (Dataset): the dataset.
        name (str): the column's name.
    """
    return dataset.data.column(name).to_numpy()


def eligible_rows(dataset: Dataset, config: BuildConfig, token_budget: np.ndarray | None, report: Report) -> np.ndarray:
    """Row numbers that pass every filter, counting drops by reason.

    Args:
        dataset (Dataset): the analysed requests.
        config (BuildConfig): the build's settings.
        token_budget (np.ndarray | None): each row's token count, capped at caps.max_tokens; None: no cap.
        report (Report): the build's report, which counts drops.
    """
    keep = np.ones(len(dataset), dtype=bool)
    report.step("requests read and valid", int(keep.sum()))
    short = column(dataset, "num_segments") < config.filters.min_segments
    _apply(keep, short, "single_segment", report)
    hashes = column(dataset, "norm_hash")
    candidates = np.flatnonzero(keep)
    _, first = np.unique(hashes[candidates], return_index=True)
    unique = np.zeros(len(dataset), dtype=bool)
    unique[candidates[first]] = True
    _apply(keep, ~unique, "duplicate", report)
    codes = column(dataset, "contamination")
    for code, reason in CONTAMINATION_REASONS.items():
        _apply(keep, codes == code, reason, report)
    if token_budget is not None:
        _apply(keep, token_budget > config.caps.max_tokens, "too_many_tokens", report)
    return np.flatnonzero(keep)


def _apply(keep: np.ndarray, drop: np.ndarray, reason: str, report: Report) -> None:
    dropped = keep & drop
    report.drop(reason, int(dropped.sum()))
    keep &= ~drop
    report.step(f"after {reason}", int(keep.sum()))


def spaced_prefixes(n: int, count: int) -> list[int]:
    """`count` prefix indices of 1..n, evenly spaced, always including n (the full request).

    Args:
        n (int): the request's segment count.
        count (int): how many prefixes to keep (0 or n and more: all).
    """
    if count <= 0 or count >= n:
        return list(range(1, n + 1))
    if count == 1:
        return [n]
    return sorted({round(1 + k * (n - 1) / (count - 1)) for k in range(count)})


def choose(rows: np.ndarray, num_segments: np.ndarray, config: BuildConfig, report: Report) -> Selection:
    """Shuffle with the seed, take requests until caps.max_pairs, split by request.

    Args:
        rows (np.ndarray): the eligible row numbers.
        num_segments (np.ndarray): each row's segment count.
        config (BuildConfig): the build's settings.
        report (Report): the build's report.
    """
    order = np.random.default_rng(config.seed).permutation(rows)
    per_request, budget = config.caps.max_pairs_per_request, config.caps.max_pairs
    counts = num_segments[order].astype(np.int64)
    if per_request > 0:
        counts = np.minimum(counts, per_request)
    selection = Selection(train=order, validation=order[:0], per_request=per_request)
    if budget and counts.sum() > budget:
        total = np.cumsum(counts)
        last = int(np.searchsorted(total, budget))  # the request whose pairs reach the budget
        selection.last_row = int(order[last])
        selection.last_count = int(budget - (total[last - 1] if last else 0))
        order = order[: last + 1]
    report.drop("over_pair_cap", len(rows) - len(order))
    report.step("requests chosen under caps", len(order))
    cut = _validation_size(len(order), config.validation_fraction)
    selection.validation, selection.train = order[:cut], order[cut:]
    return selection


def _validation_size(count: int, fraction: float) -> int:
    if fraction <= 0 or count < 2:
        return 0
    return min(count - 1, max(1, round(count * fraction)))
