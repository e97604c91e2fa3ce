"""ReFusion streaming on HumanEval with the embedded model adapted by the ReFusion objective.

    python benchmarks/bench_refusion.py --limit 20

1. The model: `recipe=smollm2_refusion`'s merged model. When it is missing, its
   data are built (when missing) and it is trained for a few hundred CPU steps
   (`accelerate launch train/sft.py recipe=smollm2_refusion`); each command is
   printed before it runs. --model evaluates another model with a mask token.
2. One resumable evaluation (recipe humaneval_smollm2_refusion, engine=refusion)
   of the first LIMIT problems into --output-dir: residual forwards (median),
   mean and median speedup, pass@1 of both sides, share at the minimum cost.
Run it from the repository root (the recipes' paths are relative to it).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from headstart.config import find_recipe, load_config
from headstart.paths import outputs_dir

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)

TRAIN_RECIPE = "smollm2_refusion"
EVAL_RECIPE = "humaneval_smollm2_refusion"
# The data build of the training recipe (its header), from the samples vendored in headstart/data/, offline.
DATA_COMMAND = [
    sys.executable, "-m", "data_builders", "recipe=code_prefix_to_answer", "sources=[mbpp,magicoder]",
    "mbpp.path=data/mbpp/mbpp.jsonl",
    "magicoder.path=data/code_sft/magicoder_oss_instruct_75k_sample500.jsonl",
    "tokenizer=smollm2", "caps.max_tokens=192", "decontamination.on_missing=skip", "decontamination.hub=false",
    "num_proc=2",
]
TRAIN_COMMAND = ["accelerate", "launch", "train/sft.py", f"recipe={TRAIN_RECIPE}"]


def run(command: list[str]) -> None:
    print("$ " + shlex.join(command), flush=True)
    subprocess.run(command, cwd=REPO, check=True)


def ensure_trained_model(model_dir: Path) -> None:
    """Build the training data and train when the merged model is absent."""
    if (model_dir / "config.json").is_file():
        return
    data_path = Path(OmegaConf.load(find_recipe(TRAIN_RECIPE)).data.path)
    if not (REPO / data_path).exists():
        run(DATA_COMMAND + [f"output_dir={data_path}"])
    run(TRAIN_COMMAND)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"training finished without a merged model at {model_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model with a mask token (default: the recipe's, trained if missing)")
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default=str(outputs_dir("bench", "refusion")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    overrides = [f"limit={args.limit}", f"output_dir={args.output_dir}"]
    overrides += [f"model={args.model}"] if args.model else []
    overrides += [f"decode.max_new_tokens={args.max_new_tokens}"] if args.max_new_tokens else []
    config = load_config(EvalConfig, [f"recipe={EVAL_RECIPE}", *overrides])
    if not args.model:
        ensure_trained_model(REPO / config.model)
    start = time.perf_counter()
    summary = run_evaluation(config)
    decode = config.decode
    print(f"\n{config.benchmark}, {summary['evaluated']} of {summary['requests']} requests evaluated "
          f"({time.perf_counter() - start:.0f}s), model {config.model}, {decode.acceptance}, "
          f"slot {decode.slot_size}, {decode.serial_blocks} blocks, thresholds {decode.slot_threshold}/{decode.token_threshold}")
    if summary["evaluated"]:
        print(f"forwards after the final token (median): baseline {summary['forwards_base_median']:g}, "
              f"streamed residual {summary['forwards_stream_median']:g}\n"
              f"speedup (forwards): mean {summary['speedup_forwards_mean']:.2f}x, "
              f"median {summary['speedup_forwards_median']:.2f}x\n"
              f"pass@1: base {summary['quality_base']:.1%}, stream {summary['quality_stream']:.1%}\n"
              f"finishing at the minimum residual cost (1 forward): {summary['minimum_cost_share']:.1%}")


if __name__ == "__main__":
    main()
