"""What the true-prefix request format and lookup regeneration buy, side by side.

    python benchmarks/bench_faster_answers.py --limit 40 --threads 2

SmolLM2-135M, greedy (lossless), 128 tokens, on the first --limit HumanEval and
MBPP test problems, in one run on the same warm model:

1. old format, plain regeneration: the code in a fence that only the final
   segment closes (`benchmarks/legacy_format.py`), the paper's procedure;
2. new format, plain regeneration (the true-prefix format, PROTOCOL.md);
3. new format, lookup regeneration (`decode.regenerate=lookup`).

Columns: speedup against plain greedy decoding (what a user gets) and, for
lookup, against the lookup decoder that reads the request alone (what streaming
adds), in forwards and wall clock; share of requests at one residual forward;
draft tokens kept; pass@1 of both sides. Each configuration is an ordinary
resumable evaluation under --output-dir/<benchmark>/<configuration>.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from legacy_format import legacy_humaneval_requests, legacy_mbpp_requests  # beside this script

from eval.engines.decode import DecodeSpec
from eval.evaluation.config import EvalConfig
from eval.evaluation.runner import run_evaluation
from eval.reporting.tables import markdown_rows
from headstart.config import load_config
from headstart.models import load_model
from headstart.paths import outputs_dir

CONFIGURATIONS = (("old format, plain", "legacy", "plain"), ("new format, plain", "new", "plain"),
                  ("new format, lookup", "new", "lookup"))
# (header, summary keys, format); "-" where a configuration has no such figure.
COLUMNS = [
    ("n", ("evaluated",), "{:g}"),
    ("pass@1 base/stream", ("quality_base", "quality_stream"), "{:.1%}/{:.1%}"),
    ("identical", ("identical_to_baseline",), "{:.0%}"),
    ("fwd base/stream (med)", ("forwards_base_median", "forwards_stream_median"), "{:g}/{:g}"),
    ("speedup fwd mean/med", ("speedup_forwards_mean", "speedup_forwards_median"), "{:.2f}x/{:.2f}x"),
    ("speedup wall mean/med", ("speedup_wall_mean", "speedup_wall_median"), "{:.2f}x/{:.2f}x"),
    ("vs lookup fwd mean/med", ("speedup_lookup_forwards_mean", "speedup_lookup_forwards_median"), "{:.2f}x/{:.2f}x"),
    ("vs lookup wall mean/med", ("speedup_lookup_wall_mean", "speedup_lookup_wall_median"), "{:.2f}x/{:.2f}x"),
    ("1-forward", ("single_forward_share",), "{:.1%}"),
    ("draft kept", ("draft_kept_mean",), "{:.1%}"),
    ("total cost", ("total_cost_mean",), "{:.2f}x"),
]


def legacy_requests(benchmark: str, data_path: str | None, limit: int):
    if benchmark == "humaneval":
        return legacy_humaneval_requests(limit)
    return legacy_mbpp_requests(data_path, limit)


def table(summaries: dict[str, dict]) -> str:
    rows = [[name] + [fmt.format(*(s[k] for k in keys)) if all(k in s for k in keys) else "-"
                      for _, keys, fmt in COLUMNS] for name, s in summaries.items()]
    return markdown_rows(["benchmark, configuration"] + [header for header, _, _ in COLUMNS], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--benchmarks", default="humaneval,mbpp")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default=str(outputs_dir("bench", "faster_answers")))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    # The suite recipe is the one home of the offline data paths.
    data_paths = load_config(EvalConfig, ["recipe=suite_smollm2"]).data_paths
    summaries = {}
    for benchmark in args.benchmarks.split(","):
        for name, request_format, regenerate in CONFIGURATIONS:
            config = EvalConfig(
                model=args.model, benchmark=benchmark, data_path=data_paths.get(benchmark), limit=args.limit,
                decode=DecodeSpec(max_new_tokens=args.max_new_tokens, regenerate=regenerate),
                record_tokens=True, output_dir=str(Path(args.output_dir) / benchmark / name.replace(", ", "-").replace(" ", "_")),
            )
            requests = legacy_requests(benchmark, config.data_path, args.limit) if request_format == "legacy" else None
            start = time.perf_counter()
            summaries[f"{benchmark}, {name}"] = run_evaluation(config, loaded, requests)
            print(f"{benchmark}, {name}: {time.perf_counter() - start:.0f}s", flush=True)
    print(f"\nSmolLM2-135M, greedy, {args.max_new_tokens} tokens, first {args.limit} problems, {args.threads} threads\n")
    print(table(summaries))


if __name__ == "__main__":
    main()
