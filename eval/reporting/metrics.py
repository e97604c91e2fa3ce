"""Per-request records -> every column PROTOCOL.md asks a report to show."""

from __future__ import annotations

import re
import statistics
import string
from collections import Counter
from typing import Any


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate results; requests where either side answered nothing are excluded
    from every column alike.

    Args:
        records (list[dict[str, Any]]): one benchmark's per-request records.
    """
    valid = [r for r in records if is_answered(r)]
    summary: dict[str, Any] = {"requests": len(records), "excluded_empty": len(records) - len(valid), "evaluated": len(valid)}
    summary |= degenerate_counts(records)
    if not valid:
        return summary
    # Skipped answers (e.g. DS-1000 problems whose library is not installed) were
    # never executed: counted, and left out of quality, never scored as passes.
    scored = [r for r in valid if not is_skipped(r)]
    summary.update(skipped=len(valid) - len(scored), quality_evaluated=len(scored))
    # What the executed verdicts ran under (eval/sandbox/), counted per kind.
    contained = Counter(r["containment"] for r in scored if r.get("containment"))
    if contained:
        summary["containment"] = dict(sorted(contained.items()))
    speedup_forwards = [r["baseline_forwards"] / r["residual_forwards"] for r in valid]
    # Count mode (EvalConfig.timed_every) times a sample: wall clock over the timed requests alone.
    timed = [r for r in valid if r["residual_seconds"] is not None]
    speedup_wall = [r["baseline_seconds"] / r["residual_seconds"] for r in timed]
    summary["timed"] = len(timed)
    kept = [r["accepted_tokens"] / r["draft_tokens"] for r in valid if r["draft_tokens"]]
    summary.update(
        quality_base=_mean(r["base_score"] for r in scored),
        quality_stream=_mean(r["stream_score"] for r in scored),
        agreement_f1=_mean(token_f1(r["stream_answer"], r["base_answer"]) for r in valid),
        forwards_base_median=statistics.median(r["baseline_forwards"] for r in valid),
        forwards_stream_median=statistics.median(r["residual_forwards"] for r in valid),
        speedup_forwards_mean=_mean(speedup_forwards),
        speedup_forwards_median=statistics.median(speedup_forwards),
        acceptance_none=_mean(r["accepted_tokens"] == 0 for r in valid),
        acceptance_all=_mean(r["accepted_tokens"] == r["draft_tokens"] > 0 for r in valid),
        # Counted, not 1 - none - all: that difference of floats printed as "-0%".
        acceptance_partial=_mean(0 < r["accepted_tokens"] != r["draft_tokens"] for r in valid),
        draft_kept_mean=_mean(kept) if kept else 0.0,
        single_forward_share=_mean(r["residual_forwards"] == 1 for r in valid),
        minimum_cost_share=_mean(r["residual_forwards"] <= residual_floor(r) for r in valid),
        total_cost_mean=_mean((r["drafting_forwards"] + r["residual_forwards"]) / r["baseline_forwards"] for r in valid),
    )
    summary |= identity(valid)
    summary |= floor_bound(valid, summary["speedup_forwards_median"])
    if all("base_tokens" in r for r in valid):  # the decoder's own parallelism: above 1 only for a slot decoder
        summary["tokens_per_forward_base"] = sum(r["base_tokens"] for r in valid) / sum(r["baseline_forwards"] for r in valid)
    if speedup_wall:
        summary.update(speedup_wall_mean=_mean(speedup_wall), speedup_wall_median=statistics.median(speedup_wall))
    if all("lookup_baseline_forwards" in r for r in valid):
        summary |= _against_lookup_baseline(valid)
    for name, values in (("forwards", speedup_forwards), ("wall", speedup_wall)):
        for bound in (1.0, 0.9, 0.8):
            if values:
                summary[f"below_{bound:g}x_{name}"] = _mean(v < bound for v in values)
    return summary


def residual_floor(record: dict[str, Any]) -> int:
    """The least a residual can cost with the request's decoder: its engine's `min_residual_forwards`,
    as the record wrote it.

    Args:
        record (dict[str, Any]): a per-request record (older ones lack the field: 1).
    """
    return record.get("min_residual_forwards", 1)


def floor_bound(records: list[dict[str, Any]], speedup_median: float) -> dict[str, Any]:
    """The residual floor beside the speedup, as the paper reads Table 1: the floor bound is the
    speedup of a request finishing at the floor (baseline forwards / floor); its median over the
    requests, and the share of it the median speedup reaches (the paper's ReFusion-8B
    HumanEval figures read this way: median speedup / (median baseline forwards / 3)).

    Args:
        records (list[dict[str, Any]]): the evaluated records.
        speedup_median (float): the median speedup in forwards over the same records.
    """
    floors = {residual_floor(r) for r in records}
    bound = statistics.median(r["baseline_forwards"] / residual_floor(r) for r in records)
    return {"residual_floor": max(floors), "floor_bound_median": bound, "floor_bound_share": speedup_median / bound}


def degenerate_counts(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Requests whose base or streamed answer is degenerate (a record's `*_degenerate` reasons), over
    every record, the empty answers too; by reason. When some records predate the check (a resumed
    older run), no count, which would be too low: `degenerate_unchecked` says how many.

    Args:
        records (list[dict[str, Any]]): one benchmark's per-request records.
    """
    unchecked = sum("base_degenerate" not in r for r in records)
    if unchecked:
        return {"degenerate_unchecked": unchecked}
    counts: dict[str, Any] = {}
    for side in ("base", "stream"):
        flagged = [r[f"{side}_degenerate"] for r in records if r.get(f"{side}_degenerate")]
        counts[f"degenerate_{side}"] = len(flagged)
        counts[f"degenerate_{side}_reasons"] = dict(sorted(Counter(reason for found in flagged for reason in found).items()))
    return counts


def identity(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What was compared token for token, and how much of it agreed: `identical_measured` requests
    whose streamed answer was compared with a baseline decoded apart (`identical_to_baseline`: the
    share of them that are identical), `counted` requests whose answers both are the drafter's D_n
    (count mode: exact if the drafter agrees), and `drafter_compared` timed requests whose drafter's
    D_n was compared with the batch-1 baseline (`drafter_agreement`: the share that agree).

    Args:
        records (list[dict[str, Any]]): one benchmark's per-request records.
    """
    measured = [r for r in records if identity_measured(r)]
    drafter = [r["drafter_identical"] for r in records if r.get("drafter_identical") is not None]
    summary: dict[str, Any] = {"identical_measured": len(measured), "counted": len(records) - len(measured),
                               "drafter_compared": len(drafter)}
    if measured:
        summary["identical_to_baseline"] = _mean(r["identical"] for r in measured)
    departures = [r["first_difference"] for r in measured if r.get("first_difference") is not None]
    if departures:  # how far into the answer a differing one still agreed (tokens)
        summary["first_difference_median"] = statistics.median(departures)
    if drafter:
        summary["drafter_agreement"] = _mean(drafter)
    return summary


def identity_measured(record: dict[str, Any]) -> bool:
    """Whether the record's answers were compared token for token (records written before the
    field existed: all but count mode's counted ones, whose `identical` was true by construction).

    Args:
        record (dict[str, Any]): a per-request record.
    """
    return record.get("identical_measured", record.get("engine") != "counted")


def identity_phrase(summary: dict[str, Any]) -> str:
    """The identity claim a summary supports, as reports say it, e.g. "100% of 14 compared; 650
    counted, drafter agrees 100% of 14": the counted requests are exact if the drafter agrees.

    Args:
        summary (dict[str, Any]): a benchmark's summary (`summarize`).
    """
    parts = []
    if summary.get("identical_measured"):
        parts.append(f"{summary['identical_to_baseline']:.0%} of {summary['identical_measured']:g} compared")
    if summary.get("counted"):
        parts.append(f"{summary['counted']:g} counted")
    phrase = "; ".join(parts) or "none compared"
    if summary.get("drafter_compared"):
        phrase += f", drafter agrees {summary['drafter_agreement']:.0%} of {summary['drafter_compared']:g}"
    return phrase


def _against_lookup_baseline(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Speedups against the lookup decoder with the request as its only source
    (`regenerate=lookup`): what streaming adds beyond lookup decoding."""
    forwards = [r["lookup_baseline_forwards"] / r["residual_forwards"] for r in records]
    wall = [r["lookup_baseline_seconds"] / r["residual_seconds"] for r in records if r["residual_seconds"] is not None]
    summary = {
        "forwards_lookup_base_median": statistics.median(r["lookup_baseline_forwards"] for r in records),
        "speedup_lookup_forwards_mean": _mean(forwards),
        "speedup_lookup_forwards_median": statistics.median(forwards),
    }
    # Compared where both were decoded (count mode's counted records hold D_n for both: None).
    compared = [r["lookup_baseline_identical"] for r in records if r["lookup_baseline_identical"] is not None]
    if compared:
        summary["lookup_baseline_identical"] = _mean(compared)
    if wall:
        summary.update(speedup_lookup_wall_mean=_mean(wall), speedup_lookup_wall_median=statistics.median(wall))
    return summary


def is_answered(record: dict[str, Any]) -> bool:
    """Both answers non-empty: a request every column counts (PROTOCOL.md: an empty answer on either side
    excludes it from all alike).

    Args:
        record (dict[str, Any]): a per-request record.
    """
    return bool(record["base_answer"].strip() and record["stream_answer"].strip())


def is_skipped(record: dict[str, Any]) -> bool:
    """A record whose answers could not be executed here (see `Score.detail`).

    Args:
        record (dict[str, Any]): a per-request record.
    """
    return str(record.get("base_status", "")).startswith("skipped")


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces.

    Args:
        text (str): the text to normalise.
    """
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def token_f1(prediction: str, reference: str) -> float:
    """Harmonic mean of token precision and recall after `normalize_text`
    (1.0 when both are empty, 0.0 when only one is).

    Args:
        prediction (str): the answer.
        reference (str): the reference answer.
    """
    predicted, expected = normalize_text(prediction).split(), normalize_text(reference).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def running_medians(records: list[dict[str, Any]]) -> dict[str, str]:
    """Short live figures for the progress bar.

    Args:
        records (list[dict[str, Any]]): the records so far.
    """
    if not records:
        return {}
    return {
        "speedup": f"{statistics.median(r['baseline_forwards'] / r['residual_forwards'] for r in records):.2f}x",
        "residual": f"{statistics.median(r['residual_forwards'] for r in records):g}",
    }


def _mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0
