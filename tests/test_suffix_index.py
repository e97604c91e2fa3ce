"""The longest-match proposer (`decode.lookup_match=longest`) against a brute-force search
written here: the occurrence with the longest matching context, ties by source order."""

from __future__ import annotations

import random

from eval.engines.lookup import LongestMatchProposer, regeneration_widths
from eval.engines.lookup_policy import LookupPolicy
from eval.engines.tokens import through_first_eos

EOS = 9


def brute_force(sources: list[list[int]], answer: list[int], min_context: int, block: int) -> list[int]:
    best = None  # (context, -source number, -position): the longest context, then the earliest occurrence
    for number, source in enumerate(sources):
        for position in range(len(source) - 1):  # a token must follow
            context = 0
            while (context < len(answer) and context <= position
                   and source[position - context] == answer[len(answer) - 1 - context]):
                context += 1
            if context >= min_context and (best is None or (context, -number, -position) > best[0]):
                best = ((context, -number, -position), number, position)
    if best is None:
        return []
    _, number, position = best
    return through_first_eos(sources[number][position + 1 : position + 1 + block], {EOS})


def test_longest_match_equals_brute_force_on_random_sources():
    generator = random.Random(0)
    for case in range(400):
        alphabet = generator.randint(2, 6)  # few tokens: many repeats, many ties
        sources = [[generator.randrange(alphabet) for _ in range(generator.randint(0, 30))] for _ in range(3)]
        answer = [generator.randrange(alphabet) for _ in range(generator.randint(1, 12))]
        min_context = generator.randint(1, 3)
        policy = LookupPolicy(3, 5, "first", min_context, match="longest")
        proposer = LongestMatchProposer(sources, policy, {EOS})
        for length in range(1, len(answer) + 1):  # the answer grows, as in one update
            assert proposer.propose(answer[:length], 64) == brute_force(sources, answer[:length], min_context, 5), case


def test_a_longer_context_in_a_later_source_beats_a_short_one_in_the_held_tail():
    """n-gram lookup (3-gram, held tail first) would follow `3 4 5` in the held tail; the
    earlier draft shares 6 tokens of context and proposes what followed there."""
    held_tail, earlier = [3, 4, 5, 70, 71], [1, 2, 0, 3, 4, 5, 6, 7, 8]
    answer = [1, 2, 0, 3, 4, 5]
    policy = LookupPolicy(3, 8, "first", 1, match="longest")
    assert LongestMatchProposer([held_tail, earlier], policy, {EOS}).propose(answer, 64) == [6, 7, 8]


def test_a_long_match_earns_a_long_block():
    source = list(range(10, 40))
    policy = LookupPolicy(3, 4, "first", 1, match="longest", max_block=16)
    proposer = LongestMatchProposer([source], policy, {EOS})
    assert proposer.propose(source[:1], 64) == source[1:5]  # context 1: the minimum block
    assert proposer.propose(source[:6], 64) == source[6:18]  # context 6: 12 tokens
    assert proposer.propose(source[:12], 64) == source[12:28]  # context 12: the cap, 16
    assert proposer.propose(source[:12], 3) == source[12:15]  # the budget still binds


def test_longest_match_regeneration_counts_by_hand():
    """Held draft 1 2 3 4 5 6 7 EOS, the answer inserts 8 after 1 2 3: verify keeps 1 2 3 and
    yields 8; `8` is nowhere, a plain step yields 4; `4` matches the held tail, which proposes
    5 6 7 EOS: kept in one forward. Verify + 2 forwards."""
    held, answer = [1, 2, 3, 4, 5, 6, 7, EOS], [1, 2, 3, 8, 4, 5, 6, 7, EOS]
    policy = LookupPolicy(3, 8, "first", 1, match="longest")
    proposer = LongestMatchProposer([held[3:], [], [50, 51]], policy, {EOS})
    assert len(regeneration_widths(answer, 3, proposer, max_new_tokens=64)) == 2
