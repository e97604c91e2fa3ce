"""Why a `greedy` streamed answer differs from its baseline: for every record of a
results directory whose answers are not identical, the first token where they part,
and the gap between the two candidates' logits in a one-pass forward over the prompt
and the baseline answer.

    python benchmarks/greedy_divergence.py outputs/bench/suite-20-128/coedit/greedy

The greedy rule is lossless in exact arithmetic. In floating point, the verify pass
(many positions in one forward) and the baseline (one token per forward) sum in
different orders; where the top two logits are within rounding of each other, the
two paths can pick different tokens. A gap near 1e-5 (fp32) is such a tie; a large
gap would be a bug.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from eval.benchmarks import Request, get_benchmark
from eval.engines.tokens import common_prefix_length
from eval.evaluation.evaluator import StreamingEvaluator
from eval.evaluation.results_dir import saved_config
from headstart.files import read_jsonl
from headstart.models import load_model


@dataclass
class Divergence:
    """The first differing token of two answers and the one-pass logit gap there."""

    index: int
    expected: int
    other: int
    gap: float  # logit(expected) - logit(other), one forward over prompt + the common prefix


@torch.inference_mode()
def first_divergence(model: PreTrainedModel, prompt: list[int], expected: list[int], other: list[int]) -> Divergence | None:
    """The first token where `other` leaves `expected`, with its logit gap; None when one
    answer is a prefix of the other (no token where both chose)."""
    index = common_prefix_length(expected, other)
    if index >= min(len(expected), len(other)):
        return None
    logits = model(torch.tensor([prompt + expected[:index]], device=model.device)).logits[0, -1].float()
    return Divergence(index, expected[index], other[index], (logits[expected[index]] - logits[other[index]]).item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = saved_config(args.results_dir)
    differing = [r for r in read_jsonl(args.results_dir / "results.jsonl") if r["identical"] is False]  # None: not compared
    print(f"{len(differing)} record(s) whose streamed answer differs from the baseline")
    if not differing:
        return
    loaded = load_model(config.model, adapter=config.adapter, dtype=config.dtype, device=config.device)
    evaluator = StreamingEvaluator(loaded, config)
    requests = {r.request_id: r for r in get_benchmark(config.benchmark, config.data_path).load()}
    for record in differing:
        report_divergence(evaluator, requests[record["request_id"]], record)


@torch.inference_mode()
def report_divergence(evaluator: StreamingEvaluator, request: Request, record: dict) -> None:
    tokenizer, model = evaluator.loaded.tokenizer, evaluator.loaded.model
    prompt = evaluator.prompts(request)[-1]
    base = tokenizer(record["base_answer"], add_special_tokens=False)["input_ids"]
    stream = tokenizer(record["stream_answer"], add_special_tokens=False)["input_ids"]
    divergence = first_divergence(model, prompt, base, stream)
    if divergence is None:
        print(f"{record['request_id']}: one answer is a prefix of the other")
        return
    print(f"{record['request_id']}: token {divergence.index}: baseline {tokenizer.decode([divergence.expected])!r}, "
          f"stream {tokenizer.decode([divergence.other])!r}, one-pass logit gap (baseline - stream) {divergence.gap:+.2e}")


if __name__ == "__main__":
    main()
