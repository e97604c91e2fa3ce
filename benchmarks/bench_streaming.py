"""Streaming speedup of SmolLM2-135M on HumanEval, and the evaluator's own cost.

    python benchmarks/bench_streaming.py --limit 40

1. The fast path against the step-by-step engine on the first COMPARE problems,
   side by side on the same warm model: wall time ratio, and every count equal.
2. `greedy` (lossless) and `threshold:0.9` evaluations of the first LIMIT
   problems (fast path: drafting batched across requests, baseline and final
   update timed at batch 1): the report table for both, in one run. Results go
   to --output-dir and are resumed, so an interrupted benchmark continues.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import torch

from eval.benchmarks import get_benchmark
from eval.config import EvalConfig
from eval.report import markdown_table
from eval.runner import StreamingEvaluator, run_evaluation
from headstart.models import load_model

COUNTS = ("base_answer", "stream_answer", "draft_tokens", "accepted_tokens",
          "baseline_forwards", "residual_forwards", "drafting_forwards")


def evaluator_cost(loaded, config: EvalConfig, compare: int) -> tuple[float, float, bool]:
    """Seconds spent by the fast path and by the stepwise engine on the same requests."""
    requests = get_benchmark(config.benchmark).load(compare)
    fast = StreamingEvaluator(loaded, replace(config, engine="fast"))
    stepwise = StreamingEvaluator(loaded, replace(config, engine="stepwise"))
    fast.warm_up(requests[0])
    start = time.perf_counter()
    fast_records = [r for group in fast.request_groups(requests) for r in fast.evaluate_many(group)]
    fast_seconds = time.perf_counter() - start
    print(f"fast path: {fast_seconds:.0f}s for {len(requests)} requests", flush=True)
    start = time.perf_counter()
    stepwise_records = [stepwise.evaluate(request) for request in requests]
    stepwise_seconds = time.perf_counter() - start
    identical = all(f[k] == s[k] for f, s in zip(fast_records, stepwise_records) for k in COUNTS)
    return fast_seconds, stepwise_seconds, identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--compare", type=int, default=5, help="problems timed with both engines")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default="outputs/bench/streaming")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    base = EvalConfig(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens)
    # The evaluator's own cost first: it is the shortest part and the one with a target.
    fast_s, stepwise_s, identical = evaluator_cost(loaded, base, args.compare)
    print(f"evaluator cost on {args.compare} problems: fast path {fast_s:.1f}s, stepwise {stepwise_s:.1f}s, "
          f"ratio {stepwise_s / fast_s:.2f}x, identical counts: {identical}", flush=True)
    summaries = {}
    for acceptance in ("greedy", "threshold:0.9"):
        config = replace(base, acceptance=acceptance,
                         output_dir=str(Path(args.output_dir) / acceptance.replace(":", "")))
        start = time.perf_counter()
        summaries[f"humaneval {acceptance}"] = run_evaluation(config, loaded)
        print(f"{acceptance}: {time.perf_counter() - start:.0f}s", flush=True)
    print("\n" + markdown_table(summaries))
    print(f"\nevaluator cost on {args.compare} problems: fast path {fast_s:.1f}s, stepwise {stepwise_s:.1f}s, "
          f"ratio {stepwise_s / fast_s:.2f}x, identical counts: {identical}")


if __name__ == "__main__":
    main()
