"""vLLM against transformers, side by side in one run: self-distilled answers (the data
builders' `answers=self`) and the drafting work of a HumanEval evaluation (every prefix
of every request drafted: greedy in one batch, `threshold:TAU` round by round).

    python benchmarks/bench_vllm.py --distill 200 --eval 20
    python benchmarks/bench_vllm.py --eval 40 --block-sizes 128 32 --vllm-cpu-bind auto

Needs the vLLM environment (bash scripts/setup_vllm.sh). Both backends get the same token
ids; the table gives generated tokens, wall clock, tokens/s and how many answers (drafts)
agree token for token. The vLLM wall clock of each task includes its engine start, shown
on its own row too. The self-distilled requests are the Magicoder rows vendored in
headstart/data/code_sft (LMSYS-Chat-1M is gated and not vendored). On a GPU machine run the same
command (scripts/setup_vllm.sh with HEADSTART_VLLM_PACKAGE=vllm==<version>); add
--device cuda for the transformers side.

`--block-sizes` compares vLLM KV-cache block sizes instead (vllm.block_size): the count-mode
drafting of the `--eval` HumanEval requests (greedy drafts of every prefix S_1..S_n, one
batch of `--vllm-batch` prompts at a time) once per size, side by side, with the drafts'
agreement with the first size's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from data_builders.answer_cache import AnswerCache
from data_builders.config import GenerationConfig
from data_builders.generation import GenerationSettings, greedy_answers_finished
from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from headstart.models import load_model
from headstart.paths import DATA_DIR
from headstart.vllm_client import vllm_unavailable
from headstart.vllm_settings import VLLMSettings

MAGICODER = DATA_DIR / "code_sft" / "magicoder_oss_instruct_75k_sample500.jsonl"


def distill(backend: str, requests: list[str], args, work: Path) -> dict:
    """Self-distilled answers of `requests` by the data builders' generation, from an empty cache."""
    batch = args.vllm_batch if backend == "vllm" else args.hf_batch
    settings = GenerationSettings(model="smollm2", max_new_tokens=args.max_new_tokens, batch_size=batch,
                                  backend=backend, device=args.device, vllm=vllm_settings(args))
    cache = AnswerCache(work / f"answers-{backend}.jsonl")
    start = time.perf_counter()
    answers = greedy_answers_finished(requests, settings, cache, desc=f"self-distil ({backend})")
    return {"seconds": time.perf_counter() - start, "answers": answers}


def drafting(loaded, backend: str, acceptance: str, requests, args, counted: bool = False,
             settings: VLLMSettings | None = None) -> dict:
    """Drafts D_1..D_{n-1} of every request and their forwards, as the evaluator's fast path computes them;
    `counted`: D_n too (count mode), in groups of requests that fit `--vllm-batch` prompts, as the evaluator sends them."""
    decode = DecodeSpec(acceptance=acceptance, max_new_tokens=args.max_new_tokens)
    start = time.perf_counter()
    untimed = {request.request_id for request in requests} if counted else set()
    evaluator = StreamingEvaluator(loaded, EvalConfig(
        model="smollm2", decode=decode, backend=backend, vllm=settings or vllm_settings(args),
        fast_batch_size=args.vllm_batch if backend == "vllm" else args.hf_eval_batch), requests, untimed)
    started = time.perf_counter()
    try:
        draftings, sent = [], []
        for group in evaluator.request_groups(requests) if counted else [requests]:
            prompts = [evaluator.prompts(request) for request in group]
            draftings += evaluator.drafts(prompts, [counted] * len(prompts))
            sent += prompts
    finally:
        evaluator.close()
    end = time.perf_counter()
    # "prompts": each request's S_1..S_n, in the order its group was sent (counted: every one was sent).
    return {"seconds": end - start, "start_seconds": started - start, "draftings": draftings, "prompts": sent}


def vllm_settings(args) -> VLLMSettings:
    return VLLMSettings(cpu_threads_bind=args.vllm_cpu_bind)


def cacheable_share(prompts: list[list[int]], block_size: int) -> float:
    """Share of the prompt tokens vLLM's prefix cache can serve when the prompts arrive in this
    order: each prompt's leading whole blocks already seen in an earlier prompt (the last token
    is always computed, so a block holding it is never served)."""
    seen: set[tuple[int, ...]] = set()
    served = 0
    for prompt in prompts:
        blocks = [tuple(prompt[: (i + 1) * block_size]) for i in range((len(prompt) - 1) // block_size)]
        hits = next((i for i, block in enumerate(blocks) if block not in seen), len(blocks))
        served += hits * block_size
        seen.update(blocks)
    return served / sum(map(len, prompts))


def compare_block_sizes(loaded, requests, args) -> list[str]:
    """Count-mode drafting of `requests` on vLLM once per block size, side by side (table rows)."""
    runs = {size: drafting(loaded, "vllm", "greedy", requests, args, counted=True,
                           settings=dataclasses.replace(vllm_settings(args), block_size=size))
            for size in args.block_sizes}
    first = args.block_sizes[0]
    prompts = [p for prompts_of in runs[first]["prompts"] for p in prompts_of]  # the same for every size
    # Every greedy answer decoded, D_1..D_n of each request in order, flat.
    answers = {size: [a for d in run["draftings"] for a in (*d.drafts, d.answer)] for size, run in runs.items()}
    lines = []
    for size, run in runs.items():
        same = sum(a == b for a, b in zip(answers[size], answers[first]))
        seconds = run["seconds"] - run["start_seconds"]
        lines.append(row(f"count-mode drafting, {len(requests)} HumanEval, block_size {size}", "vllm",
                         sum(map(len, answers[size])), seconds,
                         f"{same}/{len(answers[size])} drafts as block_size {first}; "
                         f"{cacheable_share(prompts, size):.0%} of {sum(map(len, prompts))} prompt tokens cacheable"))
    return lines


def row(task: str, backend: str, tokens: int, seconds: float, agree: str) -> str:
    return f"| {task} | {backend} | {tokens} | {seconds:.1f} | {tokens / seconds:.1f} | {agree} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distill", type=int, default=200, help="requests self-distilled")
    parser.add_argument("--eval", type=int, default=20, help="HumanEval requests whose drafting is run")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--acceptance", nargs="+", default=["greedy", "threshold:0.9"])
    parser.add_argument("--hf-batch", type=int, default=GenerationConfig().batch_size,
                        help="transformers batch (the data builders' default)")
    parser.add_argument("--hf-eval-batch", type=int, default=EvalConfig().fast_batch_size,
                        help="transformers drafting batch (the evaluator's default)")
    parser.add_argument("--vllm-batch", type=int, default=256, help="prompts per vLLM call (and fast_batch_size)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the transformers side")
    parser.add_argument("--vllm-cpu-bind", default="0",
                        help="CPU: cores of vLLM's threads (VLLM_CPU_OMP_THREADS_BIND; '0': one, as --threads 1)")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=None,
                        help="compare vLLM KV-cache block sizes on count-mode drafting only (no transformers side)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    missing = vllm_unavailable(device=args.device)
    if missing:
        raise SystemExit(f"bench_vllm: {missing}")
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2", device=args.device)
    tokenizer = loaded.tokenizer
    lines = ["| task | backend | tokens | wall s | tokens/s | agreement |", "|---|---|---|---|---|---|"]
    if args.block_sizes:
        lines += compare_block_sizes(loaded, get_benchmark("humaneval").load(args.eval), args)
        print(f"\nSmolLM2-135M fp32, {args.max_new_tokens} new tokens, vLLM's engine start excluded\n")
        print("\n".join(lines))
        return

    requests = [json.loads(line)["problem"] for line in MAGICODER.open()][: args.distill]
    with tempfile.TemporaryDirectory() as work:
        runs = {b: distill(b, requests, args, Path(work)) for b in ("transformers", "vllm")}
    same = sum(a == b for a, b in zip(runs["transformers"]["answers"], runs["vllm"]["answers"]))
    for backend, run in runs.items():
        # Generated tokens, re-encoded from the answers (+1 for the end of turn of a finished one).
        tokens = sum(len(tokenizer(a, add_special_tokens=False)["input_ids"]) + done for a, done in run["answers"])
        lines.append(row(f"self-distil {len(requests)} requests", backend, tokens, run["seconds"],
                         f"{same}/{len(requests)} answers"))

    humaneval = get_benchmark("humaneval").load(args.eval)
    for acceptance in args.acceptance:
        runs = {b: drafting(loaded, b, acceptance, humaneval, args) for b in ("transformers", "vllm")}
        pairs = list(zip(runs["transformers"]["draftings"], runs["vllm"]["draftings"]))
        drafts = sum(len(t.drafts) for t, _ in pairs)
        same = sum(a == b for t, v in pairs for a, b in zip(t.drafts, v.drafts))
        counts = sum(t.forwards == v.forwards for t, v in pairs)
        for backend, run in runs.items():
            tokens = sum(len(d) for drafting_ in run["draftings"] for d in drafting_.drafts)
            lines.append(row(f"draft {len(humaneval)} HumanEval ({acceptance})", backend, tokens, run["seconds"],
                             f"{same}/{drafts} drafts, {counts}/{len(pairs)} forward counts"))
        lines.append(f"| (vLLM engine start, included above) | vllm | | {runs['vllm']['start_seconds']:.1f} | | |")
    print(f"\nSmolLM2-135M fp32, {args.max_new_tokens} new tokens, transformers on {args.threads} thread(s)\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
