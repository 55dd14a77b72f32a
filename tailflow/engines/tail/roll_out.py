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
from tailflow.engines.tail.completion import RoundResult, rule_for
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
                   on_finished: Callable[[list[Completion]], None] | None = None) -> RoundRollout:
    """`on_finished` (streamed scoring) sees each batch of finished responses as the round goes on."""
    plan = planned.plan
    requests = sampling_requests(planned.problems, plan.responses_per_prompt, sampling, tokenizer, seed,
                                 plan.iteration, prompt_template)
    before = rollout.stats()
    started = time.perf_counter()
    result = run_round(rollout, requests, rule_for(plan, requests), steps_per_poll, on_finished)
    seconds = time.perf_counter() - started
    problems, completions = result.trained_in_launch_order(planned.problems)
    stats = summarize_rollout(completions, before, rollout.stats(), seconds)
    return RoundRollout(plan.iteration, requests, result, stats, problems, completions)
