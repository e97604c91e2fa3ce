"""The adaptation study's report (benchmarks/study_adaptation.py): study.md, its figures and the W&B curve run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from eval.before_after import report_tables
from eval.reporting.tables import markdown_rows
from eval.reporting.wandb_report import wandb_mode
from headstart.files import read_jsonl

if TYPE_CHECKING:
    from study_config import StudyConfig

    from train.config import TrainRecipe

CURVE_KEYS = ("forwards_stream_median", "draft_kept_mean", "single_forward_share", "quality_stream")


def write_study_report(config: StudyConfig, trained: TrainRecipe, output: Path, losses, best, summaries,
                       points) -> None:
    # matplotlib: not for `--help`; study_figures lies beside this script
    from study_figures import learning_curve, residual_forwards_boxes

    from eval.reporting.paired import compare_sides, paired_markdown
    from eval.reporting.plots import paired_differences

    figures, evaluation = output / "figures", config.evaluation
    records = {b: {side: read_jsonl(output / "report" / side / b / "results.jsonl") for side in summaries[b]}
               for b in evaluation.benchmarks}
    curve_scope = f"{config.curve_benchmark}, {problems(config.curve_requests)} problems at every point"
    curve_png = learning_curve(points, curve_scope, figures / "learning_curve.png")
    boxes_png = residual_forwards_boxes(records, figures / "residual_forwards.png")
    paired = compare_sides(records)  # every objective against the base, over the same requests
    paired_png = paired_differences({b: {side: list(c.differences.values()) for side, c in sides.items()}
                                     for b, sides in paired.items()}, figures / "paired_differences.png")
    first = next(iter(config.objectives))
    lines = [f"# Adaptation study: {config.model}, base vs {' vs '.join(config.objectives)}\n",
             f"Side `after` is `{first}`. Steps x rows: {', '.join(f'{o} {config.steps(o)}' for o in config.objectives)} "
             f"x {trained.run.effective_batch_size}, max length {trained.training['max_length']}. Evaluation: "
             f"{problems(evaluation.limit)} problems, {evaluation.decode.acceptance}, "
             f"regenerate={evaluation.decode.regenerate}, {evaluation.decode.max_new_tokens} tokens.\n",
             f"## Learning-rate sweep ({config.sweep_steps} steps, validation loss of each objective)\n",
             markdown_rows(["objective", *losses[first], "chosen"],
                           [[o, *(f"{v:.4f}" for v in rates.values()), f"{best[o]:g}"] for o, rates in losses.items()]), ""]
    lines += data_summary(output / "data") + timings_table(output)
    for title, (header, rows) in report_tables(summaries).items():
        lines += [f"## {title}\n", markdown_rows(header, rows), ""]
    lines += paired_markdown(paired, names={"after": first})
    curve_rows = [[o, str(p["step"]), f"{p['forwards_stream_median']:g}", f"{p['draft_kept_mean']:.1%}",
                   f"{p['single_forward_share']:.1%}", f"{p['quality_stream']:.1%}"] for o, ps in points.items() for p in ps]
    lines += [f"## Learning curve ({curve_scope})\n",
              markdown_rows(["objective", "step", "median residual fwd", "draft kept", "1-forward", "pass@1"], curve_rows),
              "", f"![learning curve](figures/{curve_png.name})", f"![residual forwards](figures/{boxes_png.name})",
              f"![paired differences](figures/{paired_png.name})"]
    (output / "study.md").write_text("\n".join(lines) + "\n")
    log_curve(config, output, points, [curve_png, boxes_png, paired_png])
    print(f"\nstudy report: {output / 'study.md'}", flush=True)


def problems(limit: int | None) -> str:
    """How many problems an evaluation read: 'the first N' or 'all the'."""
    return "all the" if limit is None else f"the first {limit}"


def data_summary(data_dir: Path) -> list[str]:
    """Requests, rows and token lengths of the training data, from the builder's report."""
    built = json.loads((data_dir / "report.json").read_text())
    rows = [[split, str(counts["requests"]), str(counts["rows"]),
             *(f"{built['tokens']['splits'][split][k]['mean']:g}" for k in ("prompt_tokens", "answer_tokens"))]
            for split, counts in built["splits"].items()]
    dropped = built["drops"].get("answer_hit_token_cap", 0)
    return [f"## Training data (`{data_dir}`; {dropped} requests dropped: answer cut at the token cap)\n",
            markdown_rows(["split", "requests", "rows", "prompt tokens (mean)", "answer tokens (mean)"], rows), ""]


def timings_table(output: Path) -> list[str]:
    path = output / "timings.json"
    timings = json.loads(path.read_text()) if path.is_file() else {}
    return ["## Wall clock per stage (seconds, this machine)\n",
            markdown_rows(["stage", "seconds"], [[k, f"{v:.0f}"] for k, v in timings.items()]), ""]


def log_curve(config: StudyConfig, output: Path, points, figures: list[Path]) -> None:
    """The learning curve as one more run of the study's W&B group."""
    import wandb

    run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "headstart", group=config.group,
                     name=f"{config.group}-curve", job_type="study-curve", dir=str(output),
                     mode=wandb_mode(None), reinit="finish_previous")
    columns = ["objective", "step", *CURVE_KEYS]
    run.log({"learning_curve": wandb.Table(columns=columns, data=[[o, p["step"], *(p[k] for k in CURVE_KEYS)]
                                                                    for o, ps in points.items() for p in ps])})
    run.log({path.stem: wandb.Image(str(path)) for path in figures})
    run.finish()
