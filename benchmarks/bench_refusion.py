"""ReFusion on this machine: the slot decoder trained here, its decoding beside its own
autoregressive decoding, and streaming on it, in the columns of the paper's Table 1.

    python benchmarks/bench_refusion.py                       # MBPP test, 50 requests
    python benchmarks/bench_refusion.py --benchmarks mbpp,humaneval --limit 20

1. The model: `recipe=smollm2_refusion_full`'s trained model (SmolLM2-135M, every weight
   trained with the ReFusion objective on its own answers to MBPP tasks it is not evaluated
   on). When it is missing, its data are built (`python -m data_builders
   recipe=smollm2_refusion_self`) and it is trained (`accelerate launch train/sft.py
   recipe=smollm2_refusion_full`); each command is printed before it runs, and both resume
   after an interruption. --model evaluates another model with a mask token.
2. Per benchmark, two resumable evaluations of the first LIMIT requests: slot decoding and
   streaming (recipe mbpp_smollm2_refusion_full, engine=refusion) and the same model decoded
   autoregressively (engine=auto, greedy, plain): its quality is the one slot decoding is held to.
3. A table per benchmark (tokens per forward of the slot decoder, quality AR / slot / stream,
   residual forwards, speedups, the residual floor and the share of the floor bound reached),
   then, last, one line for the first benchmark:
   `refusion: tokens per forward X.XX; quality AR A.A% slot S.S%; stream median X.XXx fwd (F% of floor bound)`.
Run it from the repository root (the recipes' paths are relative to it).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from eval.reporting.tables import markdown_rows
from headstart.config import find_recipe, load_config
from headstart.paths import outputs_dir

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)

DATA_RECIPE = "smollm2_refusion_self"
TRAIN_RECIPE = "smollm2_refusion_full"
EVAL_RECIPE = "mbpp_smollm2_refusion_full"
# The model's own autoregressive decoding: greedy, one token per forward after the prompt.
AR_DECODE = ["decode.engine=auto", "decode.regenerate=plain", "decode.acceptance=greedy"]


def run_command(command: list[str]) -> None:
    """Print `command`, then run it from the repository root (its failure stops the benchmark).

    Args:
        command (list[str]): the command and its arguments.
    """
    print("$ " + shlex.join(command), flush=True)
    subprocess.run(command, cwd=REPO, check=True)


def ensure_trained_model(model_dir: Path) -> None:
    """Build the training data and train when the trained model is absent (both resume).

    Args:
        model_dir (Path): where the trained model is expected.
    """
    if (model_dir / "config.json").is_file():
        return
    data_path = Path(OmegaConf.load(find_recipe(TRAIN_RECIPE)).data.path)
    if not (REPO / data_path).exists():
        run_command([sys.executable, "-m", "data_builders", f"recipe={DATA_RECIPE}"])
    run_command(["accelerate", "launch", "train/sft.py", f"recipe={TRAIN_RECIPE}"])
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"training finished without a trained model at {model_dir}")


def evaluate(overrides: list[str]) -> tuple[EvalConfig, dict[str, Any], float]:
    """One resumable evaluation of the eval recipe with `overrides`: its config, summary and seconds.

    Args:
        overrides (list[str]): `key=value` settings after the recipe.
    """
    config = load_config(EvalConfig, [f"recipe={EVAL_RECIPE}", *overrides])
    start = time.perf_counter()
    return config, run_evaluation(config), time.perf_counter() - start


def table(rows: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """One row per benchmark: the slot decoder's figures beside the same model's AR quality.

    Args:
        rows (dict[str, tuple[dict[str, Any], dict[str, Any]]]): benchmark -> (slot summary, AR summary).
    """
    header = ["benchmark", "n", "tokens/fwd", "quality AR", "quality slot", "quality stream", "fwd base/stream (med)",
              "speedup fwd med/mean", "speedup wall med", "floor", "floor bound (med)", "share of bound",
              "accept none/partial/all"]
    cells = []
    for name, (slot, ar) in rows.items():
        cells.append([
            name, f"{slot['evaluated']}", f"{slot['tokens_per_forward_base']:.2f}", f"{ar['quality_base']:.1%}",
            f"{slot['quality_base']:.1%}", f"{slot['quality_stream']:.1%}",
            f"{slot['forwards_base_median']:g}/{slot['forwards_stream_median']:g}",
            f"{slot['speedup_forwards_median']:.2f}x/{slot['speedup_forwards_mean']:.2f}x",
            f"{slot['speedup_wall_median']:.2f}x" if "speedup_wall_median" in slot else "-",
            f"{slot['residual_floor']:g}", f"{slot['floor_bound_median']:.2f}x", f"{slot['floor_bound_share']:.0%}",
            f"{slot['acceptance_none']:.0%}/{slot['acceptance_partial']:.0%}/{slot['acceptance_all']:.0%}",
        ])
    return markdown_rows(header, cells)


def headline(slot: dict[str, Any], ar: dict[str, Any]) -> str:
    """The benchmark's last line: the slot decoder's tokens per forward, both qualities, the streaming speedup.

    Args:
        slot (dict[str, Any]): the slot decoding and streaming summary.
        ar (dict[str, Any]): the same model's autoregressive summary.
    """
    return (f"refusion: tokens per forward {slot['tokens_per_forward_base']:.2f}; quality AR {ar['quality_base']:.1%} "
            f"slot {slot['quality_base']:.1%}; stream median {slot['speedup_forwards_median']:.2f}x fwd "
            f"({slot['floor_bound_share']:.0%} of floor bound)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model with a mask token (default: the recipe's, trained if missing)")
    parser.add_argument("--benchmarks", default="mbpp", help="comma-separated; the first gives the last line")
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default=str(outputs_dir("bench", "refusion")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    output = Path(args.output_dir)
    model = args.model or load_config(EvalConfig, [f"recipe={EVAL_RECIPE}"]).model
    if not args.model:
        ensure_trained_model(REPO / model)
    rows = {}
    for benchmark in args.benchmarks.split(","):
        common = [f"model={model}", f"benchmark={benchmark}", f"limit={args.limit}"]
        common += [] if benchmark == "mbpp" else ["data_path=null"]
        config, slot, seconds = evaluate([*common, f"output_dir={output / benchmark / 'slot'}"])
        _, ar, ar_seconds = evaluate([*common, *AR_DECODE, f"output_dir={output / benchmark / 'ar'}"])
        decode = config.decode
        print(f"\n{benchmark}: {slot['evaluated']} of {slot['requests']} requests ({seconds:.0f}s slot, {ar_seconds:.0f}s AR), "
              f"model {model}, {decode.acceptance}, slot {decode.slot_size}, {decode.serial_blocks} blocks, thresholds "
              f"{decode.slot_threshold}/{decode.token_threshold}, infill_kv={decode.infill_kv}, draft_end={decode.draft_end}",
              flush=True)
        rows[benchmark] = (slot, ar)
    print("\n" + table(rows) + "\n")
    print(headline(*rows[args.benchmarks.split(",")[0]]))


if __name__ == "__main__":
    main()
