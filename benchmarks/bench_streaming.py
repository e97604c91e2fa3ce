"""Streaming speedup of SmolLM2-135M on HumanEval, and the evaluator's own cost.

    python benchmarks/bench_streaming.py --limit 40

1. The fast path against the step-by-step engine on the first COMPARE problems,
   side by side on the same warm model: wall and CPU time ratios (CPU time stays
   meaningful when other jobs share the cores), and every count equal.
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
from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.evaluator import StreamingEvaluator
from eval.evaluation.runner import run_evaluation
from eval.reporting.tables import markdown_table
from headstart.models import load_model
from headstart.paths import outputs_dir

COUNTS = ("base_answer", "stream_answer", "draft_tokens", "accepted_tokens",
          "baseline_forwards", "residual_forwards", "drafting_forwards")


def evaluator_cost(loaded, config: EvalConfig, compare: int) -> tuple[Cost, Cost, bool]:
    """Wall and CPU seconds of the fast path and of the stepwise engine on the same requests.
    CPU seconds (this process) stay meaningful when other jobs share the cores."""
    requests = get_benchmark(config.benchmark).load(compare)
    fast = StreamingEvaluator(loaded, replace(config, decode=replace(config.decode, engine="fast")))
    stepwise = StreamingEvaluator(loaded, replace(config, decode=replace(config.decode, engine="stepwise")))
    fast.warm_up(requests[0])
    with Cost() as fast_cost:
        fast_records = [r for group in fast.request_groups(requests) for r in fast.evaluate_many(group)]
    print(f"fast path: {fast_cost} for {len(requests)} requests", flush=True)
    with Cost() as stepwise_cost:
        stepwise_records = [stepwise.evaluate(request) for request in requests]
    identical = all(f[k] == s[k] for f, s in zip(fast_records, stepwise_records) for k in COUNTS)
    return fast_cost, stepwise_cost, identical


class Cost:
    """Wall-clock and process CPU seconds of a `with` block."""

    def __enter__(self) -> Cost:
        self.wall, self.cpu = -time.perf_counter(), -time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall += time.perf_counter()
        self.cpu += time.process_time()

    def __str__(self) -> str:
        return f"{self.wall:.1f}s wall, {self.cpu:.1f}s CPU"


def cost_line(compare: int, fast: Cost, stepwise: Cost, identical: bool) -> str:
    return (f"evaluator cost on {compare} problems: fast path {fast}, stepwise {stepwise}; ratio "
            f"{stepwise.wall / fast.wall:.2f}x wall, {stepwise.cpu / fast.cpu:.2f}x CPU; identical counts: {identical}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=40, help="problems evaluated under both rules (0: none)")
    parser.add_argument("--compare", type=int, default=5, help="problems timed with both engines (0: none)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default=str(outputs_dir("bench", "streaming")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    base = EvalConfig(model=args.model, limit=args.limit, decode=DecodeSpec(max_new_tokens=args.max_new_tokens))
    # The evaluator's own cost first: it is the shortest part and the one with a target.
    costs = evaluator_cost(loaded, base, args.compare) if args.compare else None
    if costs:
        print(cost_line(args.compare, *costs), flush=True)
    summaries = {}
    for acceptance in ("greedy", "threshold:0.9") if args.limit else ():
        config = replace(base, decode=replace(base.decode, acceptance=acceptance),
                         output_dir=str(Path(args.output_dir) / acceptance.replace(":", "")))
        start = time.perf_counter()
        summaries[f"humaneval {acceptance}"] = run_evaluation(config, loaded)
        print(f"{acceptance}: {time.perf_counter() - start:.0f}s", flush=True)
    if summaries:
        print("\n" + markdown_table(summaries))
    if costs:
        print("\n" + cost_line(args.compare, *costs))


if __name__ == "__main__":
    main()
