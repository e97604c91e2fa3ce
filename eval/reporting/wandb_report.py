"""Log one side of a before/after report to W&B: offline unless a project is set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

RECORD_COLUMNS = ("request_id", "n_segments", "base_tokens", "draft_tokens", "accepted_tokens", "baseline_forwards",
                  "residual_forwards", "drafting_forwards", "baseline_seconds", "residual_seconds", "base_score",
                  "stream_score", "identical", "lookup_baseline_forwards", "lookup_baseline_seconds", "base_degenerate",
                  "stream_degenerate")


def wandb_mode(project: str | None) -> str:
    """Online only when a project is configured and the user did not ask for offline.

    Args:
        project (str | None): the configured W&B project, or None.
    """
    configured = project or os.environ.get("WANDB_PROJECT")
    return os.environ.get("WANDB_MODE", "online") if configured else "offline"


def log_side(config, side: str, summaries, records, figures: list[Path], resolved: dict[str, Any], paired=None) -> str:
    """One run per side in a shared group: summary metrics, paired changes against the base
    (`paired[benchmark][side]`, eval.reporting.paired), per-request table, figures, configs.
    Returns the run directory.

    Args:
        config: the evaluation's settings.
        side (str): the side's name.
        summaries: summaries[benchmark][side].
        records: records[benchmark][side].
        figures (list[Path]): the figures to log.
        resolved (dict[str, Any]): the resolved configuration.
        paired: paired[benchmark][side], the comparisons with the base, or None.
    """
    import wandb

    group = config.wandb_group or Path(config.output_dir).name
    run = wandb.init(
        project=config.wandb_project or os.environ.get("WANDB_PROJECT") or "headstart",
        group=group,
        name=f"{group}-{side}",
        job_type=f"eval-{side}",
        dir=str(Path(config.output_dir)),
        mode=wandb_mode(config.wandb_project),
        config={"side": side, "model": config.sides[side], "report": resolved},
        reinit="finish_previous",
    )
    for benchmark, sides in summaries.items():
        for key, value in sides[side].items():
            if isinstance(value, (int, float)):
                run.summary[f"{benchmark}/{key}"] = value
            elif key.endswith("_reasons"):  # degenerate answers by reason: one number each
                for reason, count in value.items():
                    run.summary[f"{benchmark}/{key}/{reason}"] = count
    for benchmark, sides in (paired or {}).items():
        if side in sides:
            for key, value in paired_numbers(sides[side]).items():
                run.summary[f"{benchmark}/paired/{key}"] = value
    rows = [[benchmark] + [table_cell(r.get(c)) for c in RECORD_COLUMNS]
            for benchmark in records for r in records[benchmark][side]]
    run.log({"requests": wandb.Table(columns=["benchmark", *RECORD_COLUMNS], data=rows)})
    run.log({path.stem: wandb.Image(str(path)) for path in figures})
    directory = run.dir
    run.finish()
    return directory


def paired_numbers(comparison) -> dict[str, Any]:
    """A PairedComparison flattened: each change's estimate, low, high and verdict; tests and counts.

    Args:
        comparison: one side's comparison with the base.
    """
    numbers: dict[str, Any] = {k: getattr(comparison, k) for k in ("requests", "wall_requests", "quality_requests", "lower",
                                                                   "equal", "higher", "wilcoxon_p", "sign_p")}
    for name, change in comparison.changes.items():
        numbers |= {f"{name}/change": change.estimate, f"{name}/low": change.low, f"{name}/high": change.high,
                    f"{name}/verdict": change.verdict}
    return numbers


def table_cell(value: Any) -> Any:
    """A record's value as a W&B table cell: a list (a record's degenerate reasons) as one string.

    Args:
        value (Any): the record's value.
    """
    return ", ".join(map(str, value)) if isinstance(value, list) else value
