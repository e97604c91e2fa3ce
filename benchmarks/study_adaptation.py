"""What adaptation buys on this CPU: the base model against `objective: sft` and `objective: distill`.

    python benchmarks/study_adaptation.py recipe=study_smollm2 [max_steps=60 limit=20 ...]

One command, resumable after a kill at any point (every stage keeps its files and
skips or resumes what is done), hours on two cores:

1. data: self-distilled prefix-to-answer rows (`headstart/recipes/data/smollm2_code_self.yaml`);
2. learning-rate sweep: a short run per objective and rate, scored by the objective's
   own loss on the validation split (sft: cross-entropy; distill: KL to the teacher);
3. training: each objective at its best rate, equal compute (same steps, batch,
   length and rows), LoRA as the paper; checkpoints for the learning curve;
4. evaluation: base, sft and distill with identical settings (`eval.before_after`
   with a third side), greedy and lossless;
5. learning curve: the intermediate checkpoints on the curve benchmark;
6. report: `<output_dir>/study.md` (sweep, Table 1-3, curve) and figures, W&B group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf
from study_config import StudyConfig  # beside this script
from study_report import CURVE_KEYS, write_study_report  # beside this script

from eval.before_after import BeforeAfterConfig, run_before_after, side_config
from eval.benchmarks import get_benchmark
from eval.evaluation.config import EvalConfig
from eval.reporting.metrics import summarize
from eval.reporting.wandb_report import wandb_mode
from headstart.config import dump_config, run_cli
from headstart.files import read_jsonl
from headstart.run_dir import check_output_dir, write_mark

if TYPE_CHECKING:
    from train.config import TrainRecipe

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)

STUDY_KIND = "study"
MERGED_FROM = ".merged-from"  # in an adapter's merge: the adapter's weights fingerprint


# --- Subprocess stages (each resumes by itself) -----------------------------------


@contextmanager
def timed(output: Path, stage: str):
    """Add the stage's wall-clock seconds to output/timings.json (a resumed stage adds its remainder)."""
    start = time.perf_counter()
    yield
    path = output / "timings.json"
    timings = json.loads(path.read_text()) if path.is_file() else {}
    timings[stage] = round(timings.get(stage, 0.0) + time.perf_counter() - start, 1)
    path.write_text(json.dumps(timings, indent=1) + "\n")


def stage_env(config: StudyConfig) -> dict[str, str]:
    """Offline hub, the study's thread count, and every W&B run in the study's group."""
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(config.threads), WANDB_RUN_GROUP=config.group,
                WANDB_MODE=wandb_mode(None))


def run_stage(config: StudyConfig, argv: list[str]) -> None:
    print(f"\n$ {' '.join(argv)}", flush=True)
    subprocess.run([sys.executable, *argv], cwd=REPO, env=stage_env(config), check=True)


def train_recipes(config: StudyConfig) -> dict[str, TrainRecipe]:
    """Each objective's train recipe with the study's `train:` settings, checked as train/sft.py checks it
    (before any work); they must agree on training.max_length, the data build's cap."""
    from train.recipe import parse_recipe  # here, not above: `--help` loads no TRL

    recipes = {objective: parse_recipe([f"recipe={name}", f"model.name_or_path={config.model}",
                                        *config.train_overrides()])[0] for objective, name in config.objectives.items()}
    if len({recipe.training["max_length"] for recipe in recipes.values()}) > 1:
        raise ValueError("the objectives' recipes differ in training.max_length: give it in train: {training: "
                         "{max_length: N}}, the data build's cap")
    return recipes


def build_data(config: StudyConfig, data_dir: Path, max_length: int) -> None:
    """The training rows, capped at max_length tokens; data built under another cap is refused."""
    if (data_dir / "dataset_dict.json").is_file():
        built = OmegaConf.load(data_dir / "config.yaml").caps.max_tokens
        if built != max_length:
            raise ValueError(f"{data_dir} was built with caps.max_tokens={built}, not training.max_length={max_length}: "
                             "use another output_dir, or remove that directory to rebuild")
        return
    with timed(data_dir.parent, "data"):
        run_stage(config, ["-m", "data_builders", f"recipe={config.data_recipe}", f"output_dir={data_dir}",
                           f"caps.max_tokens={max_length}"])


def train(config: StudyConfig, objective: str, run_dir: Path, data_dir: Path, learning_rate: float, steps: int,
          save_steps: int, evaluate: bool) -> Path:
    """One training run to `run_dir`; a finished run (its adapter saved) is not run again."""
    argv = [
        "train/sft.py", f"recipe={config.objectives[objective]}", f"model.name_or_path={config.model}",
        *config.train_overrides(),
        f"data.path={data_dir}", f"training.output_dir={run_dir}", f"training.learning_rate={learning_rate}",
        f"training.max_steps={steps}", f"training.save_steps={save_steps}", "training.save_total_limit=null",
        f"training.eval_steps={steps if evaluate else 0}",
        "run.merge=false", f"training.run_name={config.group}-{run_dir.name}",
    ]
    if not (run_dir / "adapter" / "adapter_config.json").is_file():
        with timed(Path(config.output_dir), f"train {run_dir.parent.name}/{run_dir.name}"):
            run_stage(config, argv)
    return run_dir / "adapter"


def evaluated_model(config: StudyConfig, adapter: Path) -> Path:
    """What an adapter's evaluation loads: the adapter itself, or (merge_for_eval) its float32
    merge beside it, made once per adapter content (a merge records the adapter's fingerprint: an
    adapter retrained at the same path is merged again; a merge is written aside, then renamed, so
    a killed one is made again)."""
    if not config.merge_for_eval:
        return adapter
    from headstart.models import weights_fingerprint  # here, not above: `--help` loads no torch

    merged, source = adapter.parent / f"{adapter.name}-merged", weights_fingerprint(str(adapter))
    record = merged / MERGED_FROM  # a dot file: not part of the merged model's own fingerprint
    if not (record.is_file() and record.read_text() == source):
        from train.merge import merge_adapter

        partial = adapter.parent / f"{adapter.name}-merging"
        shutil.rmtree(partial, ignore_errors=True)
        merge_adapter(adapter, partial)
        (partial / MERGED_FROM).write_text(source)
        shutil.rmtree(merged, ignore_errors=True)
        partial.rename(merged)
    return merged


def validation_loss(run_dir: Path) -> float:
    """The last `eval_loss` the trainer logged (in the newest checkpoint's trainer state)."""
    checkpoints = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    history = json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"]
    losses = [entry["eval_loss"] for entry in history if "eval_loss" in entry]
    if not losses:
        raise ValueError(f"{run_dir}: no eval_loss logged; is there a validation split?")
    return losses[-1]


# --- The study, top to bottom ------------------------------------------------------


def sweep(config: StudyConfig, output: Path, data_dir: Path) -> dict[str, dict[str, float]]:
    """losses[objective][rate]: the validation loss after `sweep_steps` at each rate."""
    losses: dict[str, dict[str, float]] = {}
    for objective in config.objectives:
        for rate in config.learning_rates:
            run_dir = output / "sweep" / f"{objective}-lr{rate:g}"
            train(config, objective, run_dir, data_dir, rate, config.sweep_steps, config.sweep_steps, evaluate=True)
            losses.setdefault(objective, {})[f"{rate:g}"] = validation_loss(run_dir)
    (output / "sweep.json").write_text(json.dumps(losses, indent=1) + "\n")
    return losses


def curve_evaluation(config: StudyConfig, report: BeforeAfterConfig, run_dir: Path, step: int) -> EvalConfig:
    """The evaluation of one intermediate checkpoint: the report's own settings (side_config) on
    the first curve_limit requests."""
    objective = run_dir.name
    checkpoint = evaluated_model(config, run_dir / f"checkpoint-{step}")
    return replace(side_config(report, "before", config.curve_benchmark), model=str(checkpoint),
                   limit=config.curve_requests,
                   output_dir=str(Path(config.output_dir) / "curve" / objective / f"step-{step}"))


def curve(config: StudyConfig, report: BeforeAfterConfig, runs: dict[str, Path]) -> dict[str, list[dict]]:
    """Curve points per objective: the base (step 0), each intermediate checkpoint, the final
    adapter, every one summarised over the same first curve_limit requests."""
    from eval.evaluation.runner import run_evaluation  # here, not above: `--help` loads no torch

    benchmark = config.curve_benchmark
    requests = get_benchmark(benchmark, report.data_paths.get(benchmark)).load(config.curve_requests)
    wanted = {request.request_id for request in requests}

    def point(step: int, results_dir: str) -> dict:
        summary = summarize([r for r in read_jsonl(Path(results_dir) / "results.jsonl") if r["request_id"] in wanted])
        return {"step": step, **{k: summary[k] for k in CURVE_KEYS}}

    side_of_model = {model: side for side, model in report.sides.items()}
    points: dict[str, list[dict]] = {}
    for objective, run_dir in runs.items():
        steps = config.steps(objective)
        every = steps // config.curve_points
        points[objective] = [point(0, side_config(report, "before", benchmark).output_dir)]
        for step in range(every, steps, every):
            evaluation = curve_evaluation(config, report, run_dir, step)
            run_evaluation(evaluation)
            points[objective].append(point(step, evaluation.output_dir))
        final = side_config(report, side_of_model[str(evaluated_model(config, run_dir / "adapter"))], benchmark)
        points[objective].append(point(steps, final.output_dir))
    (Path(config.output_dir) / "curve.json").write_text(json.dumps(points, indent=1) + "\n")
    return points


def run_study(config: StudyConfig) -> None:
    import torch  # here, not above: `--help` loads no torch

    torch.set_num_threads(config.threads)
    output = Path(config.output_dir)
    check_output_dir(output, STUDY_KIND)
    write_mark(output, STUDY_KIND)
    dump_config(config, output / "config.yaml")
    data_dir, recipes = output / "data", train_recipes(config)
    trained = next(iter(recipes.values()))

    # --- 1. Data ----------------------------------------------------------------
    build_data(config, data_dir, trained.training["max_length"])

    # --- 2. Learning-rate sweep ---------------------------------------------------
    losses = sweep(config, output, data_dir)
    best = {objective: float(min(rates, key=rates.get)) for objective, rates in losses.items()}
    print(f"learning rates chosen: {best}", flush=True)

    # --- 3. Training at equal compute -------------------------------------------------
    runs = {objective: output / "train" / objective for objective in config.objectives}
    adapters = {objective: train(config, objective, runs[objective], data_dir, best[objective], config.steps(objective),
                                 config.save_steps(objective), evaluate=False)
                for objective in config.objectives}

    # --- 4. Base vs every objective, identical settings -------------------------------
    models = {objective: str(evaluated_model(config, adapter)) for objective, adapter in adapters.items()}
    first, *more = config.objectives
    report = replace(config.evaluation, adapted=models[first], more_adapted={name: models[name] for name in more})
    with timed(output, "evaluate base and adapted"):
        summaries = run_before_after(report)

    # --- 5. Learning curve -------------------------------------------------------------
    with timed(output, "learning curve"):
        points = curve(config, report, runs)

    # --- 6. Report ---------------------------------------------------------------------
    write_study_report(config, trained, output, losses, best, summaries, points)


def main(argv: list[str] | None = None) -> int:
    return run_cli(StudyConfig, run_study, argv)


if __name__ == "__main__":
    sys.exit(main())
