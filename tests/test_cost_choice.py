"""The cost chooser (`decode.lookup_choice=cost`): its options, when an earlier forward is
settled, and widths hand-counted on token sequences made up here. It is checked lossless
and its computed counts equal to the executed ones in tests/test_lookup.py."""

from __future__ import annotations

from eval.engines.cost_choice import CostChooser, options, settled_gain
from eval.engines.lookup import Proposer, regeneration_widths, update_proposer
from eval.engines.lookup_policy import LookupPolicy

EOS = 99
HELD_TAIL = [1, 2, 3, 4, 5, 6, 7, 8]


def chooser(costs: tuple[float, ...]) -> CostChooser:
    policy = LookupPolicy(3, 4, "first", 1, choice="cost", costs=costs)
    return update_proposer(policy, HELD_TAIL, [], [], {EOS})


def test_options_run_from_a_plain_step_to_the_configured_proposal():
    policy = LookupPolicy(3, 4, "first", 1, match="longest", max_block=24, tree=4)
    assert options(policy) == [(0, 0)] + [(trees, length) for trees in (1, 2, 4) for length in (1, 2, 4, 8, 16, 24)]
    assert options(LookupPolicy(3, 8, "first", 1))[-1] == (1, 8)


def test_an_earlier_forward_is_settled_once_the_answer_has_gone_past_every_branch():
    assert settled_gain([[3, 4]], [3]) is None  # 4 may still follow
    assert settled_gain([[3, 4]], [3, 4]) == 3  # both kept, and the token the forward yields
    assert settled_gain([[3, 4]], [3, 9]) == 2
    assert settled_gain([[3], [5, 6]], [3, 7]) == 2
    assert settled_gain([[3], [3, 6]], [3]) is None  # the second branch is not decided yet


def test_costly_wide_forwards_turn_proposals_into_plain_steps_after_a_miss():
    """Greedy's answer 1 9 2 3 4 5 9 9 against the held tail 1..8, blocks of 4, a wide forward
    10 steps. F1 proposes 2 3 4 5 (the configured proposal: nothing is settled) and misses:
    every option would have added 1 token, a plain step for 1 step, a proposal for 10. From
    then on plain steps win: the proposals F3-F6 would have kept 3, 2, 1 and 0 tokens (2 3 4 5
    rejoins the tail for three), never 10 steps' worth. Fixed blocks: F1 (5 tokens fed), F2
    plain (9 follows nothing), F3 keeps 3 4 5 and yields 9, F4 plain."""
    answer = [1, 9, 2, 3, 4, 5, 9, 9]
    costly = (1.0, 10.0, 10.0, 10.0, 10.0)
    assert regeneration_widths(answer, 0, chooser(costly), max_new_tokens=64) == [5, 1, 1, 1, 1, 1, 1]
    fixed = Proposer([HELD_TAIL, []], LookupPolicy(3, 4, "first", 1), {EOS})
    assert regeneration_widths(answer, 0, fixed, max_new_tokens=64) == [5, 1, 5, 1]


def test_proposals_that_pay_back_their_width_stay():
    """Greedy's answer is the held tail itself: F1's four tokens are kept (5 tokens for 3
    steps, beating a plain step's 1 for 1), so F2 verifies the rest (7 8) in one forward."""
    cheap_enough = (1.0, 3.0, 3.0, 3.0, 3.0)
    assert regeneration_widths(HELD_TAIL, 0, chooser(cheap_enough), max_new_tokens=64) == [5, 3]
