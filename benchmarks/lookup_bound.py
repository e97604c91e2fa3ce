"""How far lookup regeneration could go on recorded answers: an upper bound.

    python benchmarks/lookup_bound.py outputs/bench/faster_answers/humaneval/new_format-plain \
        --policy lookup_match=longest --policy "lookup_match=longest lookup_max_block=32"

Reads a greedy results directory evaluated with `record_tokens=true` and replays
each request's residual update at token level (no model call): with the run's
lookup policy (`eval.engines.lookup`, the count the evaluator reports), with each
`--policy` (decode overrides, e.g. `--policy lookup_match=longest`), and with an
oracle that proposes, at every forward, the longest prefix of the rest of the answer
found anywhere in the same sources (held draft tail, earlier drafts, request), up to
the block size. No proposer that draws on these sources can beat
the oracle, so its median bounds what a better policy could buy on these answers. Beside each
policy, the tokens its regeneration forwards feed on average (a tree's nodes and the answer's
last token): what its forwards cost where width is dear.
With --width-cost (a table file, eval/engines/width_table.py), each policy's wall-clock
speedup as that table prices its forwards (the prefill and steps of the baseline against
the verify pass and the regeneration forwards, each at its width) is printed beside.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from eval.benchmarks import get_benchmark
from eval.engines.decode import DecodeSpec
from eval.engines.lookup import update_widths
from eval.engines.tokens import common_prefix_length
from eval.engines.width_measure import use_auto_table
from eval.engines.width_table import WidthCost
from eval.evaluation.config import decode_with
from eval.evaluation.evaluator import StreamingEvaluator
from eval.evaluation.results_dir import saved_config
from eval.evaluation.typing_sim import verify_width
from eval.reporting.tables import markdown_rows
from headstart.files import read_jsonl
from headstart.models import load_model


def oracle_forwards(answer: list[int], start: int, sources: list[list[int]], block: int) -> int:
    """Forwards after the verify pass when each proposal is the longest run of the
    answer's remainder that occurs in a source (at most `block` tokens)."""
    length, forwards = start + 1, 0
    while length < len(answer):
        rest = answer[length : length + block]
        best = max((common_prefix_length(source[i:], rest) for source in sources for i in range(len(source))), default=0)
        length = min(length + best + 1, len(answer))
        forwards += 1
    return forwards


def replayed_policies(decode: DecodeSpec, overrides: list[str]) -> dict[str, DecodeSpec]:
    """The run's lookup policy and one per `--policy` ("key=value key=value" over `decode`)."""
    run = replace(decode, regenerate="lookup")
    return {"lookup (the run's policy)": run} | {f"lookup, {override}": decode_with(run, override) for override in overrides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--blocks", default="8,32", help="the oracle's block sizes")
    parser.add_argument("--policy", action="append", default=[],
                        help="another lookup policy to replay: decode overrides, e.g. 'lookup_match=longest'")
    parser.add_argument("--width-cost", default=None, help="a width-cost table: also each policy's wall clock as it prices it")
    args = parser.parse_args()
    table = WidthCost.load(args.width_cost) if args.width_cost else None
    config = saved_config(args.results_dir)
    records = {r["request_id"]: r for r in read_jsonl(args.results_dir / "results.jsonl")}
    if records and "draft_token_ids" not in next(iter(records.values())):
        raise SystemExit(f"error: {args.results_dir} was not evaluated with record_tokens=true")
    # The prompts and EOS ids only: no drafting engine (the run may have drafted on vLLM).
    evaluator = StreamingEvaluator(load_model(config.model, adapter=config.adapter, device="cpu"),
                                   replace(config, backend="transformers"))
    policies, eos = replayed_policies(config.decode, args.policy), evaluator.engine.eos_token_ids
    for decode in policies.values():  # `width_cost=auto` in a --policy: this machine's table, as an evaluation's
        use_auto_table(decode, config.model, evaluator.loaded.model)
    requests = [r for r in get_benchmark(config.benchmark, config.data_path).load() if r.request_id in records]
    blocks = [int(b) for b in args.blocks.split(",")]
    speedups: dict[str, list[float]] = {name: [] for name in policies} | {f"oracle, block {b}": [] for b in blocks}
    priced: dict[str, list[float]] = {name: [] for name in policies}
    fed: dict[str, list[int]] = {name: [] for name in policies}  # tokens of each regeneration forward
    for request in requests:
        record, (previous, prompt) = records[request.request_id], evaluator.prompts(request)[-2:]
        drafts, answer = record["draft_token_ids"], record["base_token_ids"]
        held = drafts[-1]
        kept = common_prefix_length(held, answer)
        for name, decode in policies.items():
            widths = [verify_width(previous + held[:-1], prompt, held)]
            regeneration = update_widths(held, answer, kept, drafts[:-1][::-1], prompt, decode, eos)
            widths += regeneration
            fed[name] += regeneration
            speedups[name].append(len(answer) / len(widths))
            if table:
                baseline = table.relative(len(prompt)) + len(answer) - 1
                priced[name].append(baseline / sum(map(table.relative, widths)))
        for block in blocks:
            whole = kept == len(held) == len(answer)
            forwards = 1 if whole else 1 + oracle_forwards(answer, kept, [held[kept:], *drafts[:-1], prompt], block)
            speedups[f"oracle, block {block}"].append(len(answer) / forwards)
    rows = [[name, f"{statistics.median(v):.2f}x", f"{statistics.mean(v):.2f}x",
             f"{statistics.mean(fed[name]):.1f}" if fed.get(name) else "-"]
            + ([f"{statistics.median(priced[name]):.2f}x" if name in priced else "-"] if table else [])
            for name, v in speedups.items()]
    print(f"{config.benchmark}, {len(requests)} requests, residual forwards against plain greedy decoding\n")
    print(markdown_rows(["proposer", "speedup (med)", "speedup (mean)", "tokens per regeneration forward (mean)"]
                        + (["priced wall (med)"] if table else []), rows))


if __name__ == "__main__":
    main()
