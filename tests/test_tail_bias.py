"""Tail batching's length bias, measured per round from the completion rule's result (issue 25, item 5).

Hand-written finish streams, so every mean is worked out in the comments; and
a random one, checking that the lengths the result keeps account for every
token it calls wasted.
"""
import random

import pytest

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail import CompletionRule, WaitForAllRule
from tailflow.engines.track.tail_bias import tail_bias


def done(name: str, num_tokens: int, reason: FinishReason = FinishReason.EOS) -> Completion:
    """Response k of prompt p ("p#k") finished (or, with ABORT, stopped) with `num_tokens` tokens."""
    problem_id, _, index = name.rpartition("#")
    request = Request.for_problem(problem_id, int(index), (1, 2))
    return request.completion(tuple(range(num_tokens)), (0.0,) * num_tokens, reason, 0)


def launch(problem_ids, responses_per_prompt: int) -> list[Request]:
    return [Request.for_problem(p, k, (1, 2)) for p in problem_ids for k in range(responses_per_prompt)]


def short_round():
    """P0 = 2 of 3 prompts, R0 = 2 of 3 responses: a and b complete, c is deferred."""
    rule = CompletionRule(launch("abc", 3), responses_kept=2, prompts_to_complete=2)
    rule.observe([done("a#0", 3), done("b#1", 3)])
    rule.observe([done("a#2", 5)])  # a completes: a#1 aborted
    rule.observe([done("c#0", 7), done("b#0", 3)])  # b completes second: b#2, c#1, c#2 aborted
    # a#1 had 1 token, b#2 had 4, c#1 had 2; c#2 was still waiting (no partial comes back for it)
    return rule.result([done("a#1", 1, FinishReason.ABORT), done("b#2", 4, FinishReason.ABORT),
                        done("c#1", 2, FinishReason.ABORT)])


def test_a_short_round_trains_its_shortest_responses():
    result = short_round()
    assert result.unkept_lengths == {"a": (1,), "b": (4,), "c": (7, 2, 0)}
    bias = tail_bias(result)
    assert bias.kept_length_mean == pytest.approx((3 + 5 + 3 + 3) / 4)
    assert bias.completed_length_mean == pytest.approx((14 + 1 + 4) / 6)  # the aborted siblings of a and b
    assert bias.launched_length_mean == pytest.approx((19 + 7 + 2 + 0) / 9)  # c's responses too: a lower bound
    assert bias.unkept_reward_mean is None and "tail/unkept_reward_mean" not in bias.metrics()
    assert sum(n for lengths in result.unkept_lengths.values() for n in lengths) == result.wasted_tokens


def test_responses_launched_equal_to_kept_keeps_every_response_of_a_completed_prompt():
    """R = R0: only whole prompts are deferred, so a completed prompt's group is all it launched."""
    rule = CompletionRule(launch("abc", 2), responses_kept=2, prompts_to_complete=2)
    rule.observe([done("a#0", 2), done("a#1", 9), done("c#0", 4), done("b#1", 3), done("b#0", 6)])
    result = rule.result([done("c#1", 5, FinishReason.ABORT)])
    bias = tail_bias(result)
    assert result.unkept_lengths == {"a": (), "b": (), "c": (4, 5)}
    assert bias.completed_length_mean == bias.kept_length_mean == pytest.approx((2 + 9 + 3 + 6) / 4)
    assert bias.launched_length_mean == pytest.approx((20 + 4 + 5) / 6)


def test_a_round_that_waits_for_all_has_no_bias():
    rule = WaitForAllRule(launch("ab", 2), responses_kept=2)
    rule.observe([done("a#0", 2), done("b#0", 8), done("b#1", 1), done("a#1", 5)])
    bias = tail_bias(rule.result())
    assert bias.kept_length_mean == bias.completed_length_mean == bias.launched_length_mean == 4.0


def test_the_unkept_reward_is_reported_only_when_some_were_scored():
    bias = tail_bias(short_round(), unkept_reward_sum=1.5, num_unkept_scored=3)
    assert bias.unkept_reward_mean == 0.5 and bias.metrics()["tail/unkept_reward_mean"] == 0.5


@pytest.mark.parametrize("seed", range(20))
def test_every_launched_response_is_kept_or_counted_unkept(seed):
    """Random finish orders (with aborts racing finishes): each launched response is either kept or has one
    unkept length, and the unkept lengths sum to the round's wasted tokens."""
    rng = random.Random(seed)
    problems, launched, kept_count = "abcdef", 4, 3
    rule = CompletionRule(launch(problems, launched), responses_kept=kept_count, prompts_to_complete=3)
    lengths = {r.request_id: rng.randint(1, 30) for r in launch(problems, launched)}
    order = sorted(lengths, key=lambda rid: (lengths[rid], rng.random()))
    aborted, position = [], 0
    while not rule.is_done:
        batch = order[position:position + rng.randint(1, 3)]
        position += len(batch)
        aborted += rule.observe([done(rid, lengths[rid]) for rid in batch])
    partials = [done(rid, rng.randint(0, lengths[rid] - 1), FinishReason.ABORT) for rid in aborted
                if rid not in order[:position] and rng.random() < 0.8]
    result = rule.result(partials)
    num_kept = sum(len(completions) for _, completions in result.completed)
    num_unkept = sum(len(values) for values in result.unkept_lengths.values())
    assert num_kept + num_unkept == len(lengths)
    assert sum(n for values in result.unkept_lengths.values() for n in values) == result.wasted_tokens
