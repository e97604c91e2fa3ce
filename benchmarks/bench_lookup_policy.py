"""Choose `regenerate=lookup`'s proposal policy by wall clock, not by forwards alone.

    python benchmarks/bench_lookup_policy.py --limit 12 --threads 2
    python benchmarks/bench_lookup_policy.py --limit 40 --drafts-from outputs/bench/faster_answers/humaneval/new_format-plain
    python benchmarks/bench_lookup_policy.py --limit 10 --drafts-from DIR --policy "lookup_match=longest lookup_tree=8"

A forward over a block of proposed tokens costs more than a one-token step on a
CPU, so the block size that saves the most forwards is not the fastest. In one
run, on the same warm model and the same requests:

1. the cost of one forward against the number of tokens it feeds: this machine's width-cost table
   for the model (eval/engines/width_table.py; measured once, the one `decode.width_cost=auto` reads);
2. for each policy (block sizes at n-grams 3..1, first occurrence; then n-gram
   lengths and occurrence at one block size), the residual update of each request (its
   drafts decoded once, greedy, and shared by every policy), timed at batch size 1
   right after the request's plain greedy baseline: median forward and wall-clock
   speedup, and forwards per residual. With --policy, only the default and the policies
   given (decode overrides: longest match, token trees, `lookup_choice=cost width_cost=auto`).

The drafts are cached under --output-dir, so a rerun only times; --drafts-from
takes them from an evaluation run with `record_tokens=true` instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.fast_path import Drafting, batched_greedy, final_update
from eval.engines.width_measure import resolve as resolve_width_cost
from eval.engines.width_table import AUTO
from eval.evaluation.config import EvalConfig, decode_with
from eval.evaluation.evaluator import StreamingEvaluator
from eval.reporting.tables import markdown_rows
from headstart.files import read_jsonl
from headstart.models import load_model
from headstart.paths import outputs_dir

BLOCKS = (2, 4, 6, 8, 10, 16, 24, 32)
# (longest n-gram, shortest n-gram, occurrence) at --variant-block; blocks are swept at (3, 1, first).
VARIANTS = ((1, 1, "first"), (2, 1, "first"), (4, 1, "first"), (3, 2, "first"), (3, 3, "first"), (3, 1, "last"))


def recorded_drafts(results_dir: Path) -> dict[str, list[list[int]]]:
    """The drafts an evaluation run with `record_tokens=true` stored, by request id."""
    records = read_jsonl(results_dir / "results.jsonl")
    if records and "draft_token_ids" not in records[0]:
        raise ValueError(f"{results_dir} was not evaluated with record_tokens=true: it holds no drafts")
    return {r["request_id"]: r["draft_token_ids"] for r in records}


def cached_drafts(evaluator: StreamingEvaluator, requests, path: Path, batch_size: int) -> dict[str, list[list[int]]]:
    """Greedy drafts D_1..D_{n-1} of every request (D_i = greedy(S_i)), decoded once."""
    drafts = json.loads(path.read_text()) if path.exists() else {}
    todo = [r for r in requests if r.request_id not in drafts]
    if todo:
        loaded, decode = evaluator.loaded, evaluator.decode
        prompts = [p for r in todo for p in evaluator.prompts(r)[:-1]]
        answers = batched_greedy(loaded.model, prompts, loaded.tokenizer.pad_token_id, evaluator.engine.eos_token_ids,
                                 decode.max_new_tokens, batch_size)
        for request in todo:
            count = len(request.segments) - 1
            drafts[request.request_id], answers = answers[:count], answers[count:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(drafts))
    return drafts


def time_policies(evaluators: dict[str, StreamingEvaluator], requests, drafts) -> dict[str, dict[str, float]]:
    """Median speedups of the residual update under each evaluator's policy; each
    request's baseline is timed right before its residuals, so load changes hit both."""
    speedups = {name: {"fwd": [], "wall": [], "residual": []} for name in evaluators}
    baseline_engine = next(iter(evaluators.values())).engine
    for request in tqdm(requests, desc="timing residuals"):
        prompts = next(iter(evaluators.values())).prompts(request)
        baseline = baseline_engine.baseline(prompts[-1])
        for name, evaluator in evaluators.items():
            final = final_update(evaluator.engine, prompts, Drafting(drafts[request.request_id], 0))
            speedups[name]["fwd"].append(baseline.forwards / final.forwards)
            speedups[name]["wall"].append(baseline.seconds / final.seconds)
            speedups[name]["residual"].append(final.forwards)
    return {name: {"fwd": statistics.median(v["fwd"]), "wall": statistics.median(v["wall"]),
                   "wall_mean": statistics.mean(v["wall"]), "residual": statistics.median(v["residual"])}
            for name, v in speedups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--benchmark", default="humaneval")
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant-block", type=int, default=10, help="block size of the n-gram and occurrence variants")
    parser.add_argument("--output-dir", default=str(outputs_dir("bench", "lookup_policy")))
    parser.add_argument("--policy", action="append", default=[],
                        help="time this policy instead of the sweep (decode overrides: 'lookup_match=longest lookup_tree=8')")
    parser.add_argument("--drafts-from", default=None,
                        help="a greedy results dir evaluated with record_tokens=true (same model, benchmark, tokens): its drafts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    base = EvalConfig(model=args.model, benchmark=args.benchmark, decode=DecodeSpec(max_new_tokens=args.max_new_tokens))
    requests = get_benchmark(args.benchmark).load(args.limit)
    plain = StreamingEvaluator(loaded, replace(base, decode=replace(base.decode, regenerate="plain")))
    plain.warm_up(requests[0])

    table = resolve_width_cost(AUTO, args.model, str(loaded.model.device), loaded.model)
    print(f"{table.machine}, after {table.context} cached tokens:\n")
    print(markdown_rows(["tokens fed", "ms per forward", "x one-token step"],
                        [[str(w), f"{c * 1e3:.1f}", f"{table.relative(w):.2f}x"] for w, c in zip(table.widths, table.seconds)]),
          flush=True)

    if args.drafts_from:
        drafts = recorded_drafts(Path(args.drafts_from))
        requests = [r for r in requests if r.request_id in drafts]
    else:
        drafts = cached_drafts(plain, requests, Path(args.output_dir) / f"{args.benchmark}-{args.limit}-drafts.json", 32)
    evaluators = {("plain", "-", "-"): plain}
    if args.policy:
        for override in ["", *args.policy]:
            decode = decode_with(base.decode, override)
            evaluators[(override or "default", "-", "-")] = StreamingEvaluator(loaded, replace(base, decode=decode))
    policies = [] if args.policy else [(3, 1, block, "first") for block in BLOCKS] + [
        (n, m, args.variant_block, o) for n, m, o in VARIANTS]
    for ngram, min_ngram, block, occurrence in policies:
        decode = replace(base.decode, lookup_ngram=ngram, lookup_min_ngram=min_ngram, lookup_block=block,
                         lookup_occurrence=occurrence)
        evaluators[(occurrence, f"{ngram}..{min_ngram}", str(block))] = StreamingEvaluator(loaded, replace(base, decode=decode))
    figures = time_policies(evaluators, requests, drafts)
    rows = [list(name) + _cells(figures[name]) for name in evaluators]
    header = ["occurrence", "n-gram", "block", "fwd speedup (med)", "wall speedup (med)", "wall (mean)", "residual fwd (med)"]
    print(f"\n{args.benchmark}, first {args.limit}, {args.max_new_tokens} tokens, {args.threads} threads\n")
    print(markdown_rows(header, rows))


def _cells(figures: dict[str, float]) -> list[str]:
    return [f"{figures['fwd']:.2f}x", f"{figures['wall']:.2f}x", f"{figures['wall_mean']:.2f}x", f"{figures['residual']:g}"]


if __name__ == "__main__":
    main()
