"""A token tree's attention masks (eval/engines/token_tree.py), built on the model's device.

A tree forward feeds the answer's last token (the root) and the tree's nodes after the cache;
each row sees the cache, the root, its node's ancestors and itself. Models with several layer
types (Gemma-3: sliding and full) get one mask per type, a sliding layer's limited to its window:
transformers passes a 4D mask through unchanged, so a mask that ignored the window would let
sliding layers see past it and the tree would stop being greedy.

The ancestor relation is built from the parents vector one tree level per step (a node's
ancestor at distance d is its parent's at distance d - 1), as tensor operations on the device:
no Python loop over the nodes, no host-to-device copy of a mask (benchmarks/bench_tree_mask.py).
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from eval.engines.token_tree import TokenTree

TREE_ATTENTION = ("sdpa", "eager", None)  # None: transformers' default (sdpa where it can)
MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")


def tree_masks(config: PretrainedConfig, tree: TokenTree, depths: list[int], past: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor | dict[str, torch.Tensor]:
    """The tree forward's additive attention masks for the decoder whose config is `config` (the
    text config: eval.engines.base.decoder_config): one per layer type where it has several, else one.

    Args:
        config (PretrainedConfig): the decoder's text config.
        tree (TokenTree): the token tree.
        depths (list[int]): each node's depth.
        past (int): how many tokens the cache holds.
        dtype (torch.dtype): the masks' dtype.
        device (torch.device): the masks' device.
    """
    if config._attn_implementation not in TREE_ATTENTION:  # flash kernels take no custom mask: every node would see all
        raise ValueError(f"decode.lookup_tree > 1 needs attention that takes a mask (sdpa or eager), "
                         f"not {config._attn_implementation}; use decode.lookup_tree=1")
    layer_types = set(getattr(config, "layer_types", None) or ())
    unknown = layer_types - set(MASKED_LAYER_TYPES)
    if unknown:
        raise ValueError(f"decode.lookup_tree > 1 cannot mask {', '.join(sorted(unknown))} layers; use decode.lookup_tree=1")
    allowed = tree_visibility(tree, depths, past, device)
    windows = {layer_type: config.sliding_window if layer_type == "sliding_attention" else None for layer_type in layer_types}
    if len(windows) <= 1:  # one kind of layer: transformers takes a single mask
        return additive_mask(within_window(allowed, depths, past, next(iter(windows.values()), None)), dtype)
    return {layer_type: additive_mask(within_window(allowed, depths, past, window), dtype)
            for layer_type, window in windows.items()}


def tree_visibility(tree: TokenTree, depths: list[int], past: int, device: torch.device | str) -> torch.Tensor:
    """(1 + nodes, past + 1 + nodes) booleans: what each row of the tree forward may see, no window.

    Args:
        tree (TokenTree): the token tree.
        depths (list[int]): each node's depth.
        past (int): how many tokens the cache holds.
        device (torch.device | str): the result's device.
    """
    nodes = len(tree.tokens)
    allowed = torch.zeros(1 + nodes, past + 1 + nodes, dtype=torch.bool, device=device)
    allowed[:, : past + 1] = True
    allowed[1:, past + 1 :] = ancestors_or_self(torch.tensor(tree.parents, device=device), max(depths, default=0))
    return allowed


def within_window(allowed: torch.Tensor, depths: list[int], past: int, window: int | None) -> torch.Tensor:
    """`allowed` less the keys `window` or more positions behind their query (None: `allowed` itself).

    Args:
        allowed (torch.Tensor): what each row may see (`tree_visibility`).
        depths (list[int]): each node's depth.
        past (int): how many tokens the cache holds.
        window (int | None): the sliding window's length, or None.
    """
    if window is None:
        return allowed
    device = allowed.device
    query_positions = past + torch.tensor([0, *depths], device=device)
    key_positions = torch.cat([torch.arange(past + 1, device=device), query_positions[1:]])
    return allowed & (key_positions[None, :] > query_positions[:, None] - window)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `allowed`, the dtype's lowest value elsewhere, shaped (1, 1, rows, keys).

    Args:
        allowed (torch.Tensor): what each row may see.
        dtype (torch.dtype): the mask's dtype.
    """
    blocked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=allowed.device), blocked)[None, None]


def ancestors_or_self(parents: torch.Tensor, levels: int) -> torch.Tensor:
    """(nodes, nodes) booleans: [i, j] when node j is node i or one of its ancestors, from the
    parents vector (-1: a child of the root) of a tree `levels` deep; one step a level.

    Args:
        parents (torch.Tensor): each node's parent (-1: the root).
        levels (int): the tree's depth.
    """
    nodes = parents.numel()
    relation = torch.zeros(nodes, nodes, dtype=torch.bool, device=parents.device)
    rows = torch.arange(nodes, device=parents.device)
    current = rows  # each node's ancestor `level` steps up, -1 once past the root
    for _ in range(levels):
        real = current >= 0
        index = current.clamp(min=0)
        relation[rows, index] |= real
        current = torch.where(real, parents[index], current)
    return relation
