"""Roll out a planned round on the rollout workers and keep what it trained, in launch order.

The rollout phase of a step, as one engine function: the plan's requests
(each response seeded by the run seed, the iteration and its request id), the
round driven under the plan's completion rule, and the engines' counters
before and after turned into the phase's `RolloutStats`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, Request, SamplingParams
from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.rollout.rollout_stats import RolloutStats, summarize_rollout
from tailflow.engines.tail.completion import CompletionRule, RoundResult, rule_for
from tailflow.engines.tail.driver import StreamingRollout, run_round
from tailflow.engines.tail.round import PlannedRound


@dataclass(frozen=True)
class RoundRollout:
    """What a round's rollout produced: the rule's result, the phase's figures, and the trained part of it."""

    iteration: int
    requests: list[Request]
    """Every request launched, in launch order (`launch.py`)."""
    result: RoundResult
    stats: RolloutStats
    problems: list[Problem]
    """The completed prompts, in launch order."""
    completions: list[Completion]
    """Their kept responses, prompt by prompt in launch order (what the trainer sees)."""


def roll_out_round(rollout: StreamingRollout, planned: PlannedRound, sampling: SamplingParams, tokenizer,
                   prompt_template: str, seed: int, steps_per_poll: int,
                   on_finished: Callable[[list[Completion]], None] | None = None,
                   on_completed: Callable[[list[tuple[str, tuple[Completion, ...]]]], None] | None = None
                   ) -> RoundRollout:
    """`on_finished` (streamed scoring) sees each batch of finished responses as the round goes on;
    `on_completed` (the stream trainer), right after it, the prompts that batch completed with their kept
    responses (often none: it is called after every batch, so it can look again at what it waits for)."""
    plan = planned.plan
    requests = sampling_requests(planned.problems, plan.responses_per_prompt, sampling, tokenizer, seed,
                                 plan.iteration, prompt_template)
    rule = rule_for(plan, requests)
    before = rollout.stats()
    started = time.perf_counter()
    result = run_round(rollout, requests, rule, steps_per_poll, notify_completed(rule, on_finished, on_completed))
    seconds = time.perf_counter() - started
    problems, completions = result.trained_in_launch_order(planned.problems)
    stats = summarize_rollout(completions, before, rollout.stats(), seconds)
    return RoundRollout(plan.iteration, requests, result, stats, problems, completions)


def notify_completed(rule: CompletionRule, on_finished: Callable[[list[Completion]], None] | None,
                     on_completed: Callable[[list[tuple[str, tuple[Completion, ...]]]], None] | None
                     ) -> Callable[[list[Completion]], None] | None:
    """`on_finished`, followed by `on_completed` with the prompts `rule` completed since the last call (the
    driver shows the rule each batch before it calls this)."""
    if on_completed is None:
        return on_finished
    num_seen = 0

    def notify(finished: list[Completion]) -> None:
        nonlocal num_seen
        if on_finished is not None:
            on_finished(finished)
        completed = rule.completed_problem_ids()[num_seen:]
        num_seen += len(completed)
        on_completed([(problem_id, tuple(rule.kept(problem_id))) for problem_id in completed])

    return notify
