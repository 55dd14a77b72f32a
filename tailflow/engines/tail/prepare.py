"""Turn a round plan into the problems to launch, advancing the data cursor.

A fresh draw skips problems that wait in the long-prompt queue (a later epoch
can reach them again): their long round will train them, and a round must
never launch one problem twice.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.data.cursor import DataCursor, draw_prompts
from tailflow.engines.data.problem import Problem
from tailflow.engines.tail.planner import RoundPlan, plan_round
from tailflow.engines.tail.queue import LongPromptQueue


@dataclass
class PreparedRound:
    plan: RoundPlan
    problems: list[Problem]
    """Launch order: queued prompts (long round) or fresh ones."""
    cursor: DataCursor
    """The data cursor after this round's draw."""
    queue: LongPromptQueue
    """The queue after planning (a long round has taken its prompts out)."""


def prepare_round(
    iteration: int,
    queue: LongPromptQueue,
    cursor: DataCursor,
    train_problems: list[Problem],
    problems_by_id: dict[str, Problem],
    *,
    prompts_per_step: int,
    responses_kept: int,
    prompt_ratio: float,
    responses_launched: int,
    enabled: bool,
    data_seed: int,
) -> PreparedRound:
    plan = plan_round(queue, iteration, prompts_per_step, responses_kept, prompt_ratio, responses_launched, enabled)
    if plan.fresh_prompts > len(train_problems) - len(queue):
        raise ValueError(f"a round launches {plan.fresh_prompts} fresh prompts but the dataset has only "
                         f"{len(train_problems)} ({len(queue)} of them queued): lower data.prompts_per_step")
    problems = [problems_by_id[queued.problem_id] for queued in plan.queued]
    launched_ids: set[str] = set()
    while len(problems) < plan.fresh_prompts:
        for problem in draw_prompts(train_problems, cursor, plan.fresh_prompts - len(problems), data_seed):
            if problem.problem_id not in queue and problem.problem_id not in launched_ids:
                problems.append(problem)
                launched_ids.add(problem.problem_id)
    return PreparedRound(plan, problems, cursor, queue)
