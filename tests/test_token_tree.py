"""Token-tree proposals (`decode.lookup_tree`): the candidates, the trie, the accepted path and
the attention mask, against brute force and hand-counted cases. The engine's tree forward is
checked against the naive decoder in tests/test_lookup.py and tests/test_sliding_window.py."""

from __future__ import annotations

import random

import pytest
import torch
from test_suffix_index import EOS
from transformers import LlamaConfig

from eval.engines.lookup import LongestMatchProposer, regeneration_widths
from eval.engines.lookup_policy import LookupPolicy
from eval.engines.token_tree import ROOT, TokenTree, TreeProposer, tree_matched
from eval.engines.tokens import common_prefix_length
from eval.engines.tree_mask import additive_mask, tree_masks, tree_visibility, within_window


def tree_attention_mask(tree: TokenTree, depths: list[int], past: int, dtype: torch.dtype, window: int | None = None):
    """The additive mask of a single-layer-type model's tree forward (what `tree_masks` returns there)."""
    return additive_mask(within_window(tree_visibility(tree, depths, past, "cpu"), depths, past, window), dtype)


def contexts_and_continuations(sources: list[list[int]], answer: list[int], min_context: int, length: int):
    """Every occurrence with a token after it: (context, source order, continuation), brute force."""
    found = []
    for number, source in enumerate(sources):
        for position in range(len(source) - 1):
            context = 0
            while (context < len(answer) and context <= position
                   and source[position - context] == answer[len(answer) - 1 - context]):
                context += 1
            if context >= min_context:
                found.append((context, (number, position), source[position + 1 : position + 1 + length]))
    return found


def realigned_continuations(sources: list[list[int]], answer: list[int], min_context: int, length: int, realign: int):
    """The realignment candidates, brute force: for d = 1..realign, the two best occurrences of the
    answer less its last d tokens (longest context, then source order and position), resumed
    s = 0..realign + 1 tokens after them within their source; fewest edits d + s first, then
    longest context, fewer inserted tokens, occurrence, skip."""
    found = []
    for inserted in range(1, min(realign, len(answer) - 1) + 1):
        occurrences = sorted(contexts_and_continuations(sources, answer[:-inserted], min_context, length),
                             key=lambda occurrence: (-occurrence[0], occurrence[1]))[:2]
        for context, (number, position), _ in occurrences:
            source = sources[number]
            for skipped in range(realign + 2):
                start = position + 1 + skipped
                if start < len(source):
                    found.append(((inserted + skipped, -context, inserted, number, position, skipped),
                                  source[start : start + length]))
    return [continuation for _, continuation in sorted(found)]


def ranked_branches(sources: list[list[int]], answer: list[int], min_context: int, length: int, width: int,
                    realign: int = 0):
    """The spec, brute force: longest context first, then source order and position, then the
    realignment candidates; a continuation already covered by a chosen branch is skipped."""
    chosen: list[list[int]] = []
    matched = [continuation for _, _, continuation in sorted(contexts_and_continuations(sources, answer, min_context, length),
                                                              key=lambda found: (-found[0], found[1]))]
    for continuation in matched + realigned_continuations(sources, answer, min_context, length, realign):
        if len(chosen) < width and not any(taken[: len(continuation)] == continuation for taken in chosen):
            chosen.append(continuation)
    return chosen


def test_branches_equal_brute_force_and_the_first_is_the_longest_match():
    generator = random.Random(1)
    for case in range(300):
        alphabet = generator.randint(2, 6)  # few tokens: many repeats, ties and shared prefixes
        sources = [[generator.randrange(alphabet) for _ in range(generator.randint(0, 30))] for _ in range(3)]
        answer = [generator.randrange(alphabet) for _ in range(generator.randint(1, 12))]
        min_context, width = generator.randint(1, 3), generator.randint(2, 5)
        chain = LongestMatchProposer(sources, LookupPolicy(3, 5, "first", min_context, match="longest"), {EOS})
        tree = TreeProposer(sources, LookupPolicy(3, 5, "first", min_context, match="longest", tree=width), {EOS})
        realign, realigning = generator.randint(1, 3), generator.randint(width, 8)
        resumes = TreeProposer(sources, LookupPolicy(3, 5, "first", min_context, match="longest", tree=realigning,
                                                     realign=realign), {EOS})
        for length in range(1, len(answer) + 1):  # the answer grows, as in one update
            branches = tree.branches(answer[:length], 64)
            assert branches == ranked_branches(sources, answer[:length], min_context, 5, width), case
            assert (branches[0] if branches else []) == chain.propose(answer[:length], 64), case
            assert resumes.branches(answer[:length], 64) == ranked_branches(sources, answer[:length], min_context, 5,
                                                                             realigning, realign), case


def test_a_tree_branches_where_the_held_tail_and_an_earlier_draft_disagree():
    """The answer's `1` is followed by `2 3 4` in the held tail and `2 5 6` in an earlier draft:
    one trie, shared `2`; greedy following the earlier draft keeps 2 5 6 and the token after."""
    held_tail, earlier = [1, 2, 3, 4], [1, 2, 5, 6, 7]
    policy = LookupPolicy(3, 3, "first", 1, match="longest", tree=2)
    branches = TreeProposer([held_tail, earlier], policy, {EOS}).branches([0, 1], 64)
    assert branches == [[2, 3, 4], [2, 5, 6]]
    tree = TokenTree.from_branches(branches)
    assert (tree.tokens, tree.parents, tree.depths()) == ([2, 3, 4, 5, 6], [ROOT, 0, 1, 0, 3], [1, 2, 3, 2, 3])
    # predicted[0] after the root, predicted[i + 1] after node i
    predicted = [2, 5, 9, 9, 6, 7]
    assert tree.accepted_path(predicted) == [0, 3, 4]
    assert tree_matched(branches, [2, 5, 6, 7]) == 3
    assert tree.accepted_path([8, 2, 2, 2, 2, 2]) == []


def test_tree_regeneration_counts_by_hand():
    """Verify yielded `1`; the answer then follows the earlier draft 2 5 6 7 8 10 11 12 13 EOS,
    blocks of 4. Chain (held tail first): [2 3 4] keeps 2, yields 5; [6 7 8 10] kept, yields 11;
    [12 13 EOS] kept: 3 forwards. Tree [2 3 4 | 2 5 6 7]: keeps 2 5 6 7, yields 8; [10 11 12 13]
    kept, yields EOS: 2 forwards."""
    answer = [0, 1, 2, 5, 6, 7, 8, 10, 11, 12, 13, EOS]
    sources = [[1, 2, 3, 4], [1, 2, 5, 6, 7, 8, 10, 11, 12, 13, EOS]]
    chain = LongestMatchProposer(sources, LookupPolicy(3, 4, "first", 1, match="longest"), {EOS})
    tree = TreeProposer(sources, LookupPolicy(3, 4, "first", 1, match="longest", tree=2), {EOS})
    assert len(regeneration_widths(answer, 1, chain, max_new_tokens=64)) == 3
    assert len(regeneration_widths(answer, 1, tree, max_new_tokens=64)) == 2


def test_realignment_resumes_a_draft_after_a_renamed_token_by_hand():
    """An earlier draft 1 2 3 4 5 6 7 8 EOS; the answer renames 2 to 11: 0 1 11 3 4 5 6 7 8 EOS, the
    verify pass yielded 1, blocks of 4, trees of 2. Without realignment: [2 3 4 5] yields 11; 11
    occurs nowhere, a plain step yields 3; [4 5 6 7] kept, yields 8; [EOS] kept: 4 forwards. With
    it, after 11 the answer less its last token (… 1) ends at the draft's 1, resumed 0 and 1
    tokens on: [2 3 4 5 | 3 4 5 6], the second kept, yields 7; [8 EOS] kept: 3 forwards."""
    answer, sources = [0, 1, 11, 3, 4, 5, 6, 7, 8, EOS], [[], [1, 2, 3, 4, 5, 6, 7, 8, EOS]]
    tree = TreeProposer(sources, LookupPolicy(3, 4, "first", 1, match="longest", tree=2), {EOS})
    resumes = TreeProposer(sources, LookupPolicy(3, 4, "first", 1, match="longest", tree=2, realign=1), {EOS})
    assert tree.branches(answer[:3], 64) == []
    assert resumes.branches(answer[:3], 64) == [[2, 3, 4, 5], [3, 4, 5, 6]]
    assert len(regeneration_widths(answer, 1, tree, max_new_tokens=64)) == 4
    assert len(regeneration_widths(answer, 1, resumes, max_new_tokens=64)) == 3


def test_the_mask_lets_a_node_see_the_cache_the_root_and_its_ancestors_only():
    tree = TokenTree.from_branches([[2, 3], [5]])  # nodes: 2 (root's), 3 (after 2), 5 (root's)
    allowed = tree_attention_mask(tree, tree.depths(), past=2, dtype=torch.float32)[0, 0] == 0
    expected = torch.tensor([
        # cache0 cache1 root n0 n1 n2
        [1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 0, 0],  # node 0 (2)
        [1, 1, 1, 1, 1, 0],  # node 1 (3, after 2)
        [1, 1, 1, 0, 0, 1],  # node 2 (5)
    ], dtype=torch.bool)
    assert torch.equal(allowed, expected)
    # window 2: a query sees keys fewer than 2 positions behind it (node 1 sits at position 2 + 2)
    windowed = tree_attention_mask(tree, tree.depths(), past=2, dtype=torch.float32, window=2)[0, 0] == 0
    assert windowed[2].tolist() == [False, False, False, True, True, False]
    assert windowed[0].tolist() == [False, True, True, False, False, False]


def mask_by_definition(tree: TokenTree, past: int, window: int | None) -> torch.Tensor:
    """The allowed pairs, node by node from the definition: a row sees the cache and the root,
    and a node its ancestors and itself; with a window, keys fewer than `window` positions behind."""
    depths = tree.depths()
    size = 1 + len(tree.tokens)
    positions = [*range(past + 1), *(past + depth for depth in depths)]
    allowed = torch.zeros(size, past + size, dtype=torch.bool)
    for row in range(size):
        seen = set(range(past + 1))
        node = row - 1
        while node >= 0:
            seen.add(past + 1 + node)
            node = tree.parents[node]
        for key in seen:
            allowed[row, key] = window is None or positions[past + row] - positions[key] < window
    return allowed


@pytest.mark.parametrize("window", [None, 3, 6])
def test_the_mask_built_from_the_parents_vector_is_the_definitions(window):
    """Random tries (lookup-like: branches sharing prefixes) of up to 9 levels, after 5 cached tokens."""
    rng = random.Random(window or 0)
    for _ in range(20):
        tree = TokenTree.from_branches([[rng.randrange(3) for _ in range(rng.randrange(1, 10))]
                                        for _ in range(rng.randrange(1, 7))])
        built = tree_attention_mask(tree, tree.depths(), past=5, dtype=torch.float32, window=window)[0, 0] == 0
        assert torch.equal(built, mask_by_definition(tree, 5, window))


def test_a_tree_refuses_attention_that_ignores_its_mask():
    config = LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=8, num_attention_heads=1, vocab_size=10)
    tree = TokenTree.from_branches([[2, 3], [5]])
    assert tree_masks(config, tree, tree.depths(), 2, torch.float32, torch.device("cpu")).shape == (1, 1, 4, 6)
    config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="needs attention that takes a mask"):
        tree_masks(config, tree, tree.depths(), 2, torch.float32, torch.device("cpu"))


def test_tree_matched_is_the_best_branch():
    branches = [[1, 2, 3], [1, 4], [7]]
    for rest in ([1, 2, 9], [1, 4, 4], [7, 7], [5], []):
        assert tree_matched(branches, rest) == max(common_prefix_length(b, rest) for b in branches)
