"""The six-benchmark suite on SmolLM2-135M: Table 1 (quality) and Table 2
(cost and speedup) for `greedy` and `threshold:0.9`, per benchmark and macro.

    python benchmarks/bench_suite.py                         # the full run: 20 per benchmark, 128 tokens
    python benchmarks/bench_suite.py --limit 3 --max-new-tokens 32   # a reduced run
    python benchmarks/bench_suite.py --report-only           # the tables from what has finished so far

Data: the real data vendored in headstart/data/, and the schema fixtures for CoEdIT
and UltraChat (headstart/recipes/eval/suite_smollm2.yaml). Results are resumable: rerun
the same command after an interruption; each benchmark and rule keeps its own
results.jsonl under --output-dir (a different --max-new-tokens needs another dir).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from eval.evaluation.config import EvalConfig
from eval.evaluation.suite import report_finished, run_suite
from headstart.config import load_config
from headstart.models import load_model
from headstart.paths import outputs_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=20, help="requests per benchmark")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--benchmarks", default="humaneval,mbpp,canitedit,ds1000,coedit,chat")
    parser.add_argument("--acceptances", default="greedy,threshold:0.9")
    parser.add_argument("--regenerate", default="lookup", choices=("lookup", "plain"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fast-batch-size", type=int, default=None,
                        help="requests per drafting round under threshold rules (results land per round); default the recipe's")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the report from the results written so far (requests every rule finished)")
    parser.add_argument("--output-dir", default=None, help="default outputs/bench/suite-<limit>-<max_new_tokens>-<regenerate>")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    output_dir = args.output_dir or str(outputs_dir("bench", f"suite-{args.limit}-{args.max_new_tokens}-{args.regenerate}"))
    config = load_config(EvalConfig, ["recipe=suite_smollm2"])
    config.model, config.limit, config.output_dir = args.model, args.limit, output_dir
    config.decode = replace(config.decode, max_new_tokens=args.max_new_tokens, regenerate=args.regenerate)
    config.benchmarks = args.benchmarks.split(",")
    config.acceptances = args.acceptances.split(",")
    config.fast_batch_size = args.fast_batch_size or config.fast_batch_size
    config.data_paths = {k: v for k, v in config.data_paths.items() if k in config.benchmarks}
    if args.report_only:
        report_finished(config)
        return
    start = time.perf_counter()
    run_suite(config, load_model(args.model))
    print(f"suite: {time.perf_counter() - start:.0f}s, limit={args.limit}, max_new_tokens={args.max_new_tokens}, "
          f"regenerate={args.regenerate}")


if __name__ == "__main__":
    main()
