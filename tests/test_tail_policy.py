"""Tail batching policy (RollPacker): completion rule, round planner, long-prompt queue.

Hand-written finish streams pin the rule's decisions; a hypothesis simulation
of many rounds with random finish orders checks the accounting: every drawn
prompt is trained exactly once or is still queued.
"""
import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from tailflow.engines.rollout.protocol import Completion, FinishReason, Request
from tailflow.engines.tail import (
    CompletionRule,
    LongPromptQueue,
    QueuedPrompt,
    RoundKind,
    WaitForAllRule,
    launched_prompts,
    make_round_plan,
    TailState,
    rule_for,
)

FINISHED = (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH)


def request(name: str | Request) -> Request:
    """These tests' shorthand: "a#1" is response 1 of prompt "a" (the id of `Request.for_problem`)."""
    if isinstance(name, Request):
        return name
    problem_id, _, index = name.rpartition("#")
    return Request.for_problem(problem_id, int(index), (1, 2))


def done(name: str | Request, num_tokens: int = 3, reason: FinishReason = FinishReason.EOS) -> Completion:
    return request(name).completion(tuple(range(num_tokens)), (0.0,) * num_tokens, reason, 0)


def partial(name: str, num_tokens: int) -> Completion:
    return done(name, num_tokens, FinishReason.ABORT)


def launch(problem_ids, responses_per_prompt: int) -> list[Request]:
    return [Request.for_problem(p, k, (1, 2)) for p in problem_ids for k in range(responses_per_prompt)]


# ---- completion rule on hand-written streams -------------------------------------------------


def test_prompt_completes_at_r0_keeps_first_finished_and_round_ends_at_p0():
    rule = CompletionRule(launch("abc", 3), responses_kept=2, prompts_to_complete=2)
    assert rule.observe([done("a#0"), done("b#1")]) == []
    assert rule.observe([done("a#2", 5)]) == ["a#1"]  # a completes: its last response is aborted at once
    assert rule.completed_problem_ids() == ["a"] and not rule.is_done
    assert [c.request_id for c in rule.kept("a")] == ["a#0", "a#2"]
    # b completes second = P0: its extra, then every other in-flight request, are aborted
    assert rule.observe([done("c#0", 7), done("b#0")]) == ["b#2", "c#1", "c#2"]
    assert rule.is_done and rule.num_aborted == 4
    assert rule.completed_problem_ids() == ["a", "b"]
    assert [c.request_id for c in rule.kept("b")] == ["b#1", "b#0"]  # finish order, not index order
    assert rule.unfinished_problem_ids() == ["c"]
    result = rule.result([partial("a#1", 1), partial("b#2", 4), partial("c#1", 2)])
    assert [(p, [c.request_id for c in kept]) for p, kept in result.completed] == [
        ("a", ["a#0", "a#2"]),
        ("b", ["b#1", "b#0"]),
    ]
    assert result.deferred_problem_ids == ["c"]
    assert result.aborted_request_ids == ["a#1", "b#2", "c#1", "c#2"]
    assert result.wasted_tokens == 1 + 4 + 2 + 7  # partials + c#0, finished but its prompt was deferred
    with pytest.raises(KeyError):
        rule.kept("c")


def test_same_batch_overshoot_the_p0th_completion_ends_the_round():
    rule = CompletionRule(launch("abcd", 2), responses_kept=1, prompts_to_complete=2)
    batch = [done("c#1"), done("a#0"), done("b#0", 4), done("d#1", 6)]  # four prompts reach R0 in one step
    assert rule.observe(batch) == ["c#0", "a#1", "b#0", "b#1", "d#0", "d#1"]
    assert rule.completed_problem_ids() == ["c", "a"]
    assert rule.unfinished_problem_ids() == ["b", "d"]
    result = rule.result([partial("c#0", 1), partial("a#1", 1), partial("b#1", 1), partial("d#0", 1)])
    assert result.deferred_problem_ids == ["b", "d"]
    assert result.wasted_tokens == 4 + 4 + 6  # four partials + b#0, d#1 that finished after the end


def test_completion_racing_its_abort_is_ignored_and_wasted_once():
    rule = CompletionRule(launch("ab", 2), responses_kept=1, prompts_to_complete=1)
    assert rule.observe([done("a#0", 2)]) == ["a#1", "b#0", "b#1"]
    assert rule.observe([done("a#1", 9), done("b#0", 5, FinishReason.LENGTH)]) == []  # another worker was faster
    assert [c.request_id for c in rule.kept("a")] == ["a#0"]
    assert rule.completed_problem_ids() == ["a"] and rule.unfinished_problem_ids() == ["b"]
    # the engine may also report a partial for a request that raced: counted once, at its longest
    result = rule.result([partial("a#1", 3), partial("b#1", 4)])
    assert result.wasted_tokens == 9 + 5 + 4


def test_length_and_stop_count_as_finished_an_unordered_abort_does_not():
    rule = CompletionRule(launch("ab", 2), responses_kept=2, prompts_to_complete=1)
    assert rule.observe([partial("a#0", 3)]) == []  # lost elsewhere: a can no longer complete
    assert rule.observe([done("b#0", reason=FinishReason.LENGTH), done("b#1", reason=FinishReason.STOP)]) == ["a#1"]
    result = rule.result()
    assert [p for p, _ in result.completed] == ["b"] and result.deferred_problem_ids == ["a"]
    assert result.wasted_tokens == 3


def test_rule_rejects_unknown_and_twice_finished_requests_and_early_results():
    rule = CompletionRule(launch("ab", 2), responses_kept=2, prompts_to_complete=1)
    with pytest.raises(KeyError):
        rule.observe([done("zz#0")])
    rule.observe([done("a#0")])
    with pytest.raises(KeyError):
        rule.observe([done("a#0")])
    with pytest.raises(RuntimeError):
        rule.result()


@pytest.mark.parametrize(
    "request_ids, kept, to_complete",
    [(launch("ab", 1), 2, 1), (launch("ab", 2), 2, 3), ([request("a#0"), request("a#0")], 1, 1),
     (launch("a", 1), 0, 1)],
)
def test_rule_validates_its_round(request_ids, kept, to_complete):
    with pytest.raises(ValueError):
        CompletionRule(request_ids, kept, to_complete)


def test_wait_for_all_rule_keeps_everything_and_aborts_nothing():
    rule = WaitForAllRule(launch("ab", 2), responses_kept=2)
    for request_id in ["b#1", "a#0", "b#0"]:
        assert rule.observe([done(request_id)]) == [] and not rule.is_done
    assert rule.observe([done("a#1")]) == [] and rule.is_done
    result = rule.result()
    assert [(p, [c.request_id for c in kept]) for p, kept in result.completed] == [
        ("b", ["b#1", "b#0"]),
        ("a", ["a#0", "a#1"]),
    ]
    assert result.aborted_request_ids == [] and result.deferred_problem_ids == [] and result.wasted_tokens == 0
    with pytest.raises(ValueError):
        WaitForAllRule(launch("ab", 3), responses_kept=2)


def test_rule_for_picks_the_rule_of_the_round_kind():
    queue = LongPromptQueue()
    short = make_round_plan(queue, 0, 2, 2, 1.5, 3, enabled=True)
    assert type(rule_for(short, launch("abc", 3))) is CompletionRule
    sync = make_round_plan(queue, 0, 2, 2, 1.5, 3, enabled=False)
    assert type(rule_for(sync, launch("ab", 2))) is WaitForAllRule


# ---- planner -----------------------------------------------------------------------------------


def test_short_round_over_provisions_fresh_prompts():
    queue = LongPromptQueue()
    queue.defer(["q0"], 0)
    plan = make_round_plan(queue, 3, prompts_per_step=8, responses_kept=8, prompt_ratio=1.25, responses_launched=10, enabled=True)
    assert (plan.kind, plan.iteration, plan.fresh_prompts, plan.queued) == (RoundKind.SHORT, 3, 10, ())
    assert (plan.responses_per_prompt, plan.responses_kept, plan.prompts_to_complete) == (10, 8, 8)
    assert len(queue) == 1 and plan.round_metric == 0


def test_long_round_takes_the_oldest_p0_queued_prompts():
    queue = LongPromptQueue()
    queue.defer(["a", "b"], 0)
    queue.defer(["c", "a", "d"], 1)
    plan = make_round_plan(queue, 2, prompts_per_step=3, responses_kept=4, prompt_ratio=2.0, responses_launched=6, enabled=True)
    assert plan.kind is RoundKind.LONG and plan.fresh_prompts == 0 and plan.round_metric == 1
    assert [q.problem_id for q in plan.queued] == ["a", "b", "c"]
    assert (plan.responses_per_prompt, plan.responses_kept, plan.num_prompts) == (4, 4, 3)
    assert [q.problem_id for q in queue.oldest(10)] == ["d"]


def test_disabled_is_the_synchronous_baseline_and_leaves_the_queue():
    queue = LongPromptQueue()
    queue.defer(["a", "b", "c"], 0)
    plan = make_round_plan(queue, 1, prompts_per_step=2, responses_kept=4, prompt_ratio=1.5, responses_launched=6, enabled=False)
    assert (plan.kind, plan.fresh_prompts, plan.queued, plan.responses_per_prompt) == (RoundKind.SYNC, 2, (), 4)
    assert len(queue) == 3


@pytest.mark.parametrize("p0, ratio, launched", [(10, 1.1, 11), (8, 1.25, 10), (3, 1.0, 3), (4, 1.3, 6), (20, 1.15, 23)])
def test_launched_prompts_is_ceil_without_float_error(p0, ratio, launched):
    assert launched_prompts(p0, ratio) == launched


@pytest.mark.parametrize(
    "args, message",
    [
        ((4, 4, 1.25, 3), "responses_launched"),
        ((4, 4, 0.9, 5), "prompt_ratio"),
        ((0, 4, 1.25, 5), "prompts_per_step"),
        ((4, 0, 1.25, 5), "responses_kept"),
    ],
)
def test_planner_validates_its_arguments(args, message):
    p0, r0, ratio, launched = args
    with pytest.raises(ValueError, match=message):
        make_round_plan(LongPromptQueue(), 0, p0, r0, ratio, launched, enabled=True)


# ---- queue -------------------------------------------------------------------------------------


def test_queue_deduplicates_keeps_position_and_counts_deferrals():
    queue = LongPromptQueue()
    queue.defer(["a", "b"], 0)
    queue.defer(["c", "a", "c"], 4)
    assert len(queue) == 3 and "a" in queue
    assert queue.oldest(3) == [QueuedPrompt("a", 2, 0, 4), QueuedPrompt("b", 1, 0, 0), QueuedPrompt("c", 1, 4, 4)]
    assert queue.take_oldest(2) == [QueuedPrompt("a", 2, 0, 4), QueuedPrompt("b", 1, 0, 0)]
    assert [q.problem_id for q in queue.oldest(5)] == ["c"]
    assert queue.take_oldest(5) == [QueuedPrompt("c", 1, 4, 4)] and len(queue) == 0


def test_queue_state_round_trips_through_json():
    queue = LongPromptQueue()
    queue.defer(["x", "y"], 1)
    queue.defer(["z", "x"], 2)
    tail = TailState(queue=tuple(queue.prompts()))
    restored = TailState.model_validate(json.loads(tail.model_dump_json())).long_queue()
    assert restored.oldest(10) == queue.oldest(10)
    restored.defer(["y"], 3)
    assert restored.oldest(10)[1] == QueuedPrompt("y", 2, 1, 3)
    with pytest.raises(ValueError):
        TailState(queue=tuple(queue.prompts()) * 2).long_queue()


# ---- many rounds with random finish orders ------------------------------------------------------


def run_round(rule, request_ids, rng: random.Random):
    """An engine finishing requests in a random order and random batches; ~30% of aborts race and finish anyway.

    Returns (every completion delivered to the rule in order, partials the engine's abort returned).
    """
    pending = [r.request_id for r in request_ids]
    rng.shuffle(pending)
    racing, delivered, partials, ordered_aborts = [], [], [], []
    while pending or racing:
        size = rng.randint(1, 3)
        batch = [done(r, rng.randint(1, 40), rng.choice(FINISHED)) for r in racing + pending[:size]]
        pending, racing = pending[size:], []
        delivered += batch
        for request_id in rule.observe(batch):
            ordered_aborts.append(request_id)
            if request_id not in pending:
                continue  # finished later in the same batch: already delivered, ignored by the rule
            pending.remove(request_id)
            if rng.random() < 0.3:
                racing.append(request_id)
            else:
                partials.append(partial(request_id, rng.randint(0, 40)))
    assert rule.is_done and len(set(ordered_aborts)) == len(ordered_aborts) == rule.num_aborted
    return delivered, partials


def first_to_reach(delivered, responses_kept: int) -> list[str]:
    """Prompts in the order their R0-th response was delivered (the rule's completion order, unbounded)."""
    counts, order = {}, []
    for completion in delivered:
        problem_id = completion.problem_id
        counts[problem_id] = counts.get(problem_id, 0) + 1
        if counts[problem_id] == responses_kept:
            order.append(problem_id)
    return order


@settings(max_examples=150, deadline=None)
@given(
    p0=st.integers(1, 4),
    r0=st.integers(1, 3),
    extra=st.integers(0, 2),
    ratio=st.sampled_from([1.0, 1.25, 1.5, 2.0, 2.5]),
    iterations=st.integers(1, 10),
    enabled=st.booleans(),
    rng=st.randoms(use_true_random=False),
)
def test_many_rounds_lose_no_prompt_and_train_none_twice(p0, r0, extra, ratio, iterations, enabled, rng):
    queue, num_drawn, fresh_in_plans, trained = LongPromptQueue(), 0, 0, []
    for iteration in range(iterations):
        queued_before = len(queue)
        plan = make_round_plan(queue, iteration, p0, r0, ratio, r0 + extra, enabled)
        expected = RoundKind.SYNC if not enabled else RoundKind.LONG if queued_before >= p0 else RoundKind.SHORT
        assert plan.kind is expected
        fresh = [f"p{num_drawn + i}" for i in range(plan.fresh_prompts)]
        num_drawn += plan.fresh_prompts
        problem_ids = fresh + [q.problem_id for q in plan.queued]
        request_ids = launch(problem_ids, plan.responses_per_prompt)
        rule = rule_for(plan, request_ids)
        delivered, partials = run_round(rule, request_ids, rng)
        result = rule.result(partials)

        completed = [p for p, _ in result.completed]
        assert completed == first_to_reach(delivered, r0)[:p0]  # exactly P0, the first to reach R0
        for problem_id, kept in result.completed:
            assert list(kept) == [c for c in delivered if c.problem_id == problem_id][:r0]
        kept_ids = {c.request_id for _, kept in result.completed for c in kept}
        unkept = sum(len(c.token_ids) for c in delivered if c.request_id not in kept_ids)
        assert result.wasted_tokens == unkept + sum(len(c.token_ids) for c in partials)
        assert sorted(completed + result.deferred_problem_ids) == sorted(problem_ids)
        if plan.kind is RoundKind.SHORT:
            fresh_in_plans += plan.fresh_prompts
            assert plan.fresh_prompts == launched_prompts(p0, ratio) and plan.responses_per_prompt == r0 + extra
            # every prompt past the first P0 is deferred, and only by aborting at least one of its requests
            assert len(result.deferred_problem_ids) == plan.fresh_prompts - p0
            aborted_prompts = {request(request_id).problem_id for request_id in result.aborted_request_ids}
            assert set(result.deferred_problem_ids) <= aborted_prompts
        else:
            assert result.aborted_request_ids == [] and result.deferred_problem_ids == [] and result.wasted_tokens == 0
            assert plan.responses_per_prompt == r0
        if plan.kind is RoundKind.LONG:
            assert plan.fresh_prompts == 0 and sorted(completed) == sorted(q.problem_id for q in plan.queued)
        if plan.kind is RoundKind.SYNC:
            fresh_in_plans += plan.fresh_prompts
            assert plan.fresh_prompts == p0
        trained += completed
        queue.defer(result.deferred_problem_ids, iteration)

    queued = {q.problem_id for q in queue.oldest(len(queue))}
    assert len(trained) == len(set(trained)) and not set(trained) & queued
    assert set(trained) | queued == {f"p{i}" for i in range(num_drawn)}
    assert num_drawn == fresh_in_plans
    assert TailState(queue=tuple(queue.prompts())).long_queue().oldest(len(queue)) == queue.oldest(len(queue))


def test_a_full_queue_triggers_one_long_round_then_short_rounds_resume():
    queue, rng, kinds = LongPromptQueue(), random.Random(0), []
    for iteration in range(4):
        plan = make_round_plan(queue, iteration, prompts_per_step=2, responses_kept=2, prompt_ratio=2.0,
                          responses_launched=3, enabled=True)
        kinds.append(plan.kind)
        ids = [f"i{iteration}-{n}" for n in range(plan.fresh_prompts)] + [q.problem_id for q in plan.queued]
        request_ids = launch(ids, plan.responses_per_prompt)
        rule = rule_for(plan, request_ids)
        run_round(rule, request_ids, rng)
        queue.defer(rule.result().deferred_problem_ids, iteration)
    assert kinds == [RoundKind.SHORT, RoundKind.LONG, RoundKind.SHORT, RoundKind.LONG]
    assert len(queue) == 0


def trajectory(name: str, stop, num_tokens: int = 3) -> Completion:
    """A multi-turn trajectory's completion that ended with `stop` (its outcome decides whether it is trained)."""
    from dataclasses import replace

    from tailflow.engines.env.trajectory import TrajectoryOutcome

    return replace(done(name, num_tokens, FinishReason.STOP), response_mask=(True,) * num_tokens,
                   outcome=TrajectoryOutcome(stop, (0.0,), (0.0, 0.0), (num_tokens,)))


def test_a_failed_environment_never_counts_as_finished_while_a_redundant_trajectory_can_replace_it():
    """R = 3 launched, R0 = 2 kept: a trajectory whose environment failed is passed over for the next good one;
    only a prompt that can no longer reach R0 good ones completes with failed ones filling in (dropped by the
    trainer), and whatever it did not keep is counted as waste."""
    from tailflow.engines.env.trajectory import StopReason

    rule = CompletionRule([request(f"a#{i}") for i in range(3)] + [request(f"b#{i}") for i in range(3)],
                          responses_kept=2, prompts_to_complete=2)
    assert rule.observe([trajectory("a#0", StopReason.ENV_ERROR, 5), trajectory("a#1", StopReason.DONE)]) == []
    assert rule.observe([trajectory("a#2", StopReason.MAX_TURNS)]) == []  # a: two good ones, the failed one passed
    assert [c.request_id for c in rule.kept("a")] == ["a#1", "a#2"]
    # b: two failures leave one running, so at most one good one: it completes with the failures, b#2 aborted
    assert rule.observe([trajectory("b#0", StopReason.TIMEOUT, 4), trajectory("b#1", StopReason.ENV_ERROR, 4)]) \
        == ["b#2"]
    assert [c.request_id for c in rule.kept("b")] == ["b#0", "b#1"] and rule.is_done
    result = rule.result()
    assert result.wasted_tokens == 5  # a#0's tokens; b's failures are kept (as dropped), b#2 aborted at 0


def test_single_turn_completions_and_good_trajectories_complete_exactly_as_before():
    from tailflow.engines.env.trajectory import StopReason

    plain = CompletionRule([request(f"a#{i}") for i in range(3)], responses_kept=2, prompts_to_complete=1)
    assert plain.observe([done("a#0"), done("a#1")]) == ["a#2"]
    multi = CompletionRule([request(f"a#{i}") for i in range(3)], responses_kept=2, prompts_to_complete=1)
    assert multi.observe([trajectory("a#0", StopReason.DONE), trajectory("a#1", StopReason.TURN_TOKEN_LIMIT)]) \
        == ["a#2"]
