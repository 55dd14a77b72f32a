"""begin_round / settle_round (engines/tail/round.py) over many iterations on the embedded arithmetic data.

A hypothesis run plays whole runs: each round's outcome defers a random choice of its launched prompts
(exactly the ones a short round could not complete) and the properties are checked after every round:
fresh draws never take a queued prompt, no round launches a problem twice, a long round takes the queue's
oldest P0, the cursor's epoch wraps, every problem is reached once a full epoch has been drawn, and a dataset
too small for a round is a clear error.
"""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailflow.engines.data.arith import ArithmeticTask
from tailflow.engines.tail import (LongPromptQueue, RoundKind, RoundResult, TailSettings, TailState, begin_round,
                                   launched_prompts, settle_round)

NUM_ITERATIONS = 30
PROBLEMS = ArithmeticTask().generate(40, seed=0, split="train")


def prepare(iteration: int, tail: TailState, problems, prompts_per_step: int, prompt_ratio: float,
            enabled: bool = True):
    settings = TailSettings(prompts_per_step=prompts_per_step, responses_kept=2, prompt_ratio=prompt_ratio,
                            responses_launched=3, enabled=enabled, data_seed=7, steps_per_poll=1)
    return begin_round(tail, iteration, settings, problems, {problem.problem_id: problem for problem in problems})


def deferring(problem_ids: list[str]) -> RoundResult:
    """A round outcome that gave up on these prompts (all else about it is irrelevant to the queue)."""
    return RoundResult(completed=[], deferred_problem_ids=problem_ids, aborted_request_ids=[], wasted_tokens=0)


def is_too_small(num_problems: int, tail: TailState, prompts_per_step: int, prompt_ratio: float,
                 enabled: bool) -> bool:
    """The next round draws more fresh prompts than the dataset has outside the queue (a long round draws none)."""
    if enabled and len(tail.queue) >= prompts_per_step:
        return False
    fresh = launched_prompts(prompts_per_step, prompt_ratio) if enabled else prompts_per_step
    return fresh > num_problems - len(tail.queue)


@settings(max_examples=60, deadline=None)
@given(
    num_problems=st.integers(min_value=1, max_value=len(PROBLEMS)),
    prompts_per_step=st.integers(min_value=1, max_value=6),
    prompt_ratio=st.sampled_from([1.0, 1.25, 1.5, 2.0, 3.0]),
    enabled=st.booleans(),
    outcome_seed=st.integers(min_value=0, max_value=2**32),
)
def test_many_rounds_keep_the_queue_and_the_epoch_consistent(num_problems, prompts_per_step, prompt_ratio, enabled,
                                                             outcome_seed):
    problems = PROBLEMS[:num_problems]
    outcomes = random.Random(outcome_seed)
    tail = TailState()
    ever_launched: set[str] = set()
    for iteration in range(NUM_ITERATIONS):
        if is_too_small(num_problems, tail, prompts_per_step, prompt_ratio, enabled):
            with pytest.raises(ValueError, match=rf"dataset has only {num_problems} .*lower data.prompts_per_step"):
                prepare(iteration, tail, problems, prompts_per_step, prompt_ratio, enabled)
            return
        queued_before = [prompt.problem_id for prompt in tail.queue]
        prepared = prepare(iteration, tail, problems, prompts_per_step, prompt_ratio, enabled)
        assert [prompt.problem_id for prompt in tail.queue] == queued_before  # planning changes no committed state
        launched = [problem.problem_id for problem in prepared.problems]
        cursor = prepared.tail.cursor
        assert len(launched) == len(set(launched)) == prepared.plan.num_prompts  # nothing launched twice
        assert cursor.epoch * num_problems + cursor.position == cursor.num_drawn  # the cursor counts every draw
        queued_after_plan = [prompt.problem_id for prompt in prepared.tail.queue]
        if prepared.plan.kind is RoundKind.LONG:
            assert launched == queued_before[:prompts_per_step]  # the oldest P0, in queue order
            assert queued_after_plan == queued_before[prompts_per_step:]
        else:
            assert not set(launched) & set(queued_before)  # fresh draws skip queued prompts
            assert queued_after_plan == queued_before
        deferred = []
        if prepared.plan.kind is RoundKind.SHORT:  # P0 prompts complete; the rest wait for a long round
            deferred = outcomes.sample(launched, len(launched) - prompts_per_step)
        tail = settle_round(prepared, deferring(deferred))
        assert [prompt.problem_id for prompt in tail.queue] == queued_after_plan + deferred
        ever_launched.update(launched)
    if tail.cursor.num_drawn >= num_problems:  # a whole epoch was drawn: every problem was trained or waits
        assert tail.cursor.epoch >= 1
        assert ever_launched | {prompt.problem_id for prompt in tail.queue} == {
            problem.problem_id for problem in problems}


def test_the_epoch_wraps_mid_round_without_launching_a_problem_twice():
    """5 problems, 4 fresh per round: the second round takes 1 from epoch 0 and 3 from epoch 1, skipping the
    one drawn from epoch 0 if epoch 1's order repeats it."""
    problems = PROBLEMS[:5]
    first = prepare(0, TailState(), problems, prompts_per_step=4, prompt_ratio=1.0)
    assert (first.tail.cursor.epoch, first.tail.cursor.position) == (0, 4)
    second = prepare(1, settle_round(first, deferring([])), problems, prompts_per_step=4, prompt_ratio=1.0)
    assert second.tail.cursor.epoch == 1
    launched = [problem.problem_id for problem in second.problems]
    assert len(set(launched)) == 4
    assert set(launched) >= {p.problem_id for p in problems} - {p.problem_id for p in first.problems}


def test_a_dataset_smaller_than_a_round_is_an_error_naming_the_setting():
    with pytest.raises(ValueError, match="launches 5 fresh prompts but the dataset has only 4 .0 of them queued, 0 "
                                         "in flight in earlier rounds.: lower data.prompts_per_step"):
        prepare(0, TailState(), PROBLEMS[:4], prompts_per_step=4, prompt_ratio=1.25)


def test_queued_prompts_count_against_the_dataset():
    queue = LongPromptQueue()
    queue.defer([problem.problem_id for problem in PROBLEMS[:3]], iteration=0)
    with pytest.raises(ValueError, match="only 6 .3 of them queued."):
        prepare(1, TailState(queue=tuple(queue.prompts())), PROBLEMS[:6], prompts_per_step=4, prompt_ratio=1.0)


def test_without_deferral_unfinished_prompts_are_dropped_and_every_round_is_short():
    """tail.defer false (redundant environment rollout): the prompts a short round could not complete leave no
    trace in the queue, so no long round ever comes, and later fresh draws are free to take them again."""
    tail = TailState()
    for iteration in range(6):
        prepared = prepare(iteration, tail, PROBLEMS, prompts_per_step=4, prompt_ratio=1.5)
        assert prepared.plan.kind is RoundKind.SHORT and len(prepared.problems) == 6
        tail = settle_round(prepared, deferring([p.problem_id for p in prepared.problems[4:]]), defer=False)
        assert tail.queue == ()
    with_queue = settle_round(prepared, deferring([p.problem_id for p in prepared.problems[4:]]))
    assert len(with_queue.queue) == 2
