"""What building a token tree's attention masks costs per tree forward (eval/engines/tree_mask.py).

    python benchmarks/bench_tree_mask.py [--device cpu] [--past 512] [--repeats 200]

Trees are tries of random branches shaped like the lookup policies' (branches x tokens: 8 x 8,
the default tree; 64 x 8; 64 x 32, the realigning tree of docs/results.md), built after `--past`
cached tokens, for a model with one layer type (one mask) and for Gemma-3's sliding and full
layers (two masks, window 512). Each figure is the median of `--repeats` calls, masks on
`--device` included. `--module` names where `tree_masks` lives, so that an older checkout (before
the masks were built on the device, `--module eval.engines.ar`) prints its figures by the same
script: copy it there and run it with `PYTHONPATH=<that checkout>`.
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import time

import torch
from transformers import Gemma3TextConfig, LlamaConfig

from eval.engines.token_tree import TokenTree

SHAPES = ((8, 8), (64, 8), (64, 32))  # (branches, tokens a branch)
WINDOW = 512


def random_tree(branches: int, length: int, seed: int = 0) -> TokenTree:
    """A trie of `branches` random branches over a 6-token alphabet, so that branches share prefixes as
    lookup's candidates do (they continue the same few contexts)."""
    rng = random.Random(seed)
    return TokenTree.from_branches([[rng.randrange(6) for _ in range(length)] for _ in range(branches)])


def configs() -> dict[str, object]:
    llama = LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=8, num_attention_heads=1, vocab_size=16)
    gemma = Gemma3TextConfig(num_hidden_layers=2, hidden_size=8, intermediate_size=8, num_attention_heads=1,
                             num_key_value_heads=1, head_dim=8, vocab_size=16, sliding_window=WINDOW,
                             layer_types=["sliding_attention", "full_attention"])
    for config in (llama, gemma):
        config._attn_implementation = "sdpa"
    return {"one layer type": llama, "sliding + full": gemma}


def median_seconds(call, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats + 1):  # the first call warms up
        started = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--past", type=int, default=512, help="cached tokens before the tree")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--module", default="eval.engines.tree_mask", help="the module that defines tree_masks")
    args = parser.parse_args()
    tree_masks = importlib.import_module(args.module).tree_masks
    device = torch.device(args.device)
    print(f"tree_masks from {args.module}, {args.past} cached tokens, device {device}, median of {args.repeats}")
    print("| tree (branches x tokens) | nodes | one layer type (ms) | sliding + full (ms) |")
    print("|---|---|---|---|")
    for branches, length in SHAPES:
        tree = random_tree(branches, length)
        cells = [f"{mask_seconds(tree_masks, config, tree, args.past, device, args.repeats) * 1e3:.3f}"
                 for config in configs().values()]
        print(f"| {branches} x {length} | {len(tree.tokens)} | {' | '.join(cells)} |")


def mask_seconds(tree_masks, config, tree: TokenTree, past: int, device: torch.device, repeats: int) -> float:
    depths = tree.depths()
    return median_seconds(lambda: tree_masks(config, tree, depths, past, torch.float32, device), repeats, device)

if __name__ == "__main__":
    main()
