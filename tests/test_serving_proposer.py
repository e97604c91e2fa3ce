"""The speculative proposals the server's vLLM engine verifies, on their own (no engine): the
evaluator's lookup policy, one forward at a time, and how a row of vLLM's batch finds its drafts."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from eval.engines.decode import DecodeSpec
from eval.engines.lookup import HeldDraftProposer, regeneration_widths, update_proposer
from eval.serving.proposer import BOARD, DraftProposer
from eval.serving.sessions import Session, complete_prefix

EOS = {0}
POLICY = DecodeSpec().lookup


def test_the_held_draft_is_proposed_while_the_answer_follows_it_then_lookup_takes_over():
    held = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    proposer = HeldDraftProposer(POLICY, held, [], [1, 2, 3], EOS)
    assert proposer.propose([], 4) == [5, 6, 7, 8]
    assert proposer.propose([5, 6, 7, 8], 4) == [9, 10, 11, 12]
    # The answer breaks from the draft after 5 tokens (an inserted 99): the evaluator's lookup over
    # the unaccepted tail realigns with it.
    answer = [5, 6, 7, 8, 9, 99, 10, 11, 12]
    lookup = update_proposer(POLICY, held[5:], [], [1, 2, 3], EOS)
    assert proposer.propose(answer, 4) == lookup.propose(answer, 4) == [13, 14]


def test_the_held_draft_proposal_stops_after_its_eos_and_at_the_budget():
    proposer = HeldDraftProposer(POLICY, [5, 6, 0, 7], [], [1], EOS)
    assert proposer.propose([], 8) == [5, 6, 0]
    assert proposer.propose([5], 1) == [6]
    assert proposer.propose([5], 0) == []


def test_no_policy_verifies_the_held_draft_and_regenerates_plainly():
    proposer = HeldDraftProposer(None, [5, 6, 7], [[5, 6, 7, 8]], [1], EOS)
    assert proposer.propose([5], 8) == [6, 7]
    assert proposer.propose([5, 6, 9], 8) == []  # broken: plain decoding, as regenerate=plain


def test_settled_tokens_match_the_evaluators_regeneration_forwards():
    """A chain engine proposing with the budget the evaluator's lookup uses settles the same tokens per
    forward after the break as the evaluator's regeneration (regeneration_widths)."""
    held, prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [1, 2, 3]
    answer = [5, 6, 7, 8, 9, 99, 10, 11, 12, 13, 14, 15, 16, 0]
    accepted = 5
    budget = 40
    lookup = update_proposer(POLICY, held[accepted:], [], prompt, EOS)
    widths = regeneration_widths(answer, accepted, lookup, budget)
    proposer = HeldDraftProposer(POLICY, held, [], prompt, EOS)
    length, forwards = accepted + 1, 0  # the verify pass settled answer[:accepted + 1]
    while length < len(answer):
        proposal = proposer.propose(answer[:length], budget - length - 1)
        matched = 0
        while matched < len(proposal) and length + matched < len(answer) and proposal[matched] == answer[length + matched]:
            matched += 1
        length = min(length + matched + 1, len(answer))
        forwards += 1
    assert forwards == len(widths)


def vllm_config(k: int = 4, max_model_len: int = 64):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


def batch(rows: list[list[int]], width: int = 64) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.zeros((len(rows) + 1, width), dtype=np.int64)
    for index, row in enumerate(rows):
        tokens[index, : len(row)] = row
    return tokens, np.array([len(r) for r in rows] + [0])


@pytest.fixture
def board():
    BOARD.postings.clear()
    BOARD.rows.clear()
    BOARD.policy, BOARD.eos_token_ids = POLICY, EOS
    yield BOARD
    BOARD.postings.clear()
    BOARD.rows.clear()


def test_each_row_gets_its_own_requests_draft_and_counts_what_was_kept(board):
    board.post("a", [1, 2, 3], 64, {"held": list(range(10, 19)), "earlier": []})
    board.post("b", [1, 2, 4], 64, {"held": [20, 21, 22, 23, 24, 25], "earlier": []})
    board.post("plain", [1, 2, 5], 64, None)
    proposer = DraftProposer(vllm_config(k=4))
    tokens, lengths = batch([[1, 2, 4, 20], [1, 2, 3, 10], [1, 2, 5, 30]])
    proposals = proposer.propose([[20], [10], [30]], lengths, tokens)
    assert proposals == [[21, 22, 23, 24], [11, 12, 13, 14], []]
    # vLLM kept 2 of b's 4 and all 4 of a's; the rows swapped places in the batch meanwhile.
    tokens, lengths = batch([[1, 2, 3, 10, 11, 12, 13, 14, 15], [1, 2, 4, 20, 21, 22, 77]])
    proposals = proposer.propose([[11, 12, 13, 14, 15], [21, 22, 77]], lengths, tokens)
    assert proposals == [[16, 17, 18], []]  # a goes on with its draft; b left its draft, and 77 matches nothing
    # a ends here: its last proposal was made at the step that ended it, never verified, not counted.
    assert board.remove("a") == {"proposed": 4, "accepted": 4, "verifications": 1}
    assert board.remove("b") == {"proposed": 4, "accepted": 2, "verifications": 1}
    assert board.remove("plain") == {"proposed": 0, "accepted": 0, "verifications": 0}


def test_the_longest_posted_prompt_wins_and_two_rows_of_one_prompt_take_one_posting_each(board):
    board.post("short", [1, 2], 64, {"held": [9, 9], "earlier": []})
    board.post("long", [1, 2, 3], 64, {"held": [7, 8], "earlier": []})
    board.post("twin", [1, 2, 3], 64, {"held": [7, 8], "earlier": []})
    proposer = DraftProposer(vllm_config(k=4))
    tokens, lengths = batch([[1, 2, 3, 6], [1, 2, 3, 6], [1, 2, 5]])
    proposals = proposer.propose([[6], [6], [5]], lengths, tokens)
    assert proposals[0] == proposals[1] == []  # the answer left the draft at once; nothing in the lookup
    assert {id(board.rows[0]), id(board.rows[1])} == {id(board.postings["long"]), id(board.postings["twin"])}
    assert board.rows[2] is board.postings["short"]


def test_proposals_stop_before_the_models_length(board):
    board.post("a", [1, 2, 3], 64, {"held": list(range(10, 30)), "earlier": []})
    tokens, lengths = batch([[1, 2, 3, 10]], width=16)
    assert DraftProposer(vllm_config(k=8, max_model_len=8)).propose([[10]], lengths, tokens) == [[11, 12, 13]]


def test_a_request_without_drafts_proposes_from_the_request_itself(board):
    board.post("a", [4, 5, 6, 7, 8, 9], 64, {"held": [], "earlier": []})
    tokens, lengths = batch([[4, 5, 6, 7, 8, 9, 5, 6]])
    assert DraftProposer(vllm_config(k=3)).propose([[6]], lengths, tokens) == [[7, 8, 9]]


def test_a_sessions_sources_are_its_newest_draft_then_the_older_ones():
    session = Session("s", [], 16, 0.0)
    session.keep("A. ", [1, 2])
    session.keep("A. B. ", [1, 3])
    session.keep("A. ", [1, 2, 4])  # a resumed draft of the same prefix replaces the paused one
    assert session.sources() == {"held": [1, 2, 4], "earlier": [[1, 3]]}
    assert session.sources([9]) == {"held": [9], "earlier": [[1, 2, 4], [1, 3]]}


def test_the_complete_prefix_is_every_segment_but_the_last():
    assert complete_prefix("Sort a list. Then print it") == "Sort a list."
    assert complete_prefix("Sort a list") == ""


def test_a_requests_own_policy_overrides_the_engines(board):
    board.post("longest", [1, 2], 64, {"held": [], "earlier": [], "policy": {**vars(POLICY), "match": "longest"}})
    board.post("plain", [1, 3], 64, {"held": [5], "earlier": [], "policy": None})
    board.post("default", [1, 4], 64, {"held": [], "earlier": []})
    assert board.postings["longest"].proposer.policy.match == "longest"
    assert board.postings["plain"].proposer.policy is None
    assert board.postings["default"].proposer.policy is POLICY


def test_nothing_is_proposed_past_the_requests_answer_cap(board):
    board.post("a", [1, 2, 3], 4, {"held": list(range(10, 30)), "earlier": []})
    tokens, lengths = batch([[1, 2, 3, 10]])
    assert DraftProposer(vllm_config(k=8)).propose([[10]], lengths, tokens) == [[11, 12]]  # 4 tokens: 10, 11, 12 + bonus


def test_a_failing_proposer_proposes_nothing_more_and_the_step_goes_on(board):
    board.post("a", [1, 2, 3], 64, {"held": [10, 11], "earlier": []})
    board.post("b", [1, 2, 4], 64, {"held": [20, 21], "earlier": []})
    board.postings["a"].proposer.held = None  # a proposer in a broken state: propose raises
    tokens, lengths = batch([[1, 2, 3, 9], [1, 2, 4, 20]])
    assert DraftProposer(vllm_config()).propose([[9], [20]], lengths, tokens) == [[], [21]]
    assert board.postings["a"].proposer is None
