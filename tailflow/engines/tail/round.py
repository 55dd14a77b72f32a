"""A round's two ends: `begin_round` chooses its prompts, `settle_round` queues the ones it gave up on.

Between them the caller launches the plan's requests and runs them under the
round's completion rule (pipeline.py). Both ends are pure: they take a
`TailState` and return a new one, and the data cursor advances only in the
returned state.

A fresh draw skips problems that wait in the long-prompt queue (a later
epoch can reach them again): their long round will train them, and a round
must never launch one problem twice.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import AbstractSet, Mapping, Sequence

from tailflow.engines.data.cursor import draw_prompts
from tailflow.engines.data.problem import Problem
from tailflow.engines.tail.completion import RoundResult
from tailflow.engines.tail.planner import RoundPlan, make_round_plan
from tailflow.engines.tail.state import TailSettings, TailState


@dataclass(frozen=True)
class PlannedRound:
    plan: RoundPlan
    problems: list[Problem]
    """Launch order: queued prompts (long round) or fresh ones."""
    tail: TailState
    """The tail state after planning: a long round has taken its prompts out, the cursor is past the draw."""


def begin_round(tail: TailState, iteration: int, settings: TailSettings, problems: Sequence[Problem],
                problems_by_id: Mapping[str, Problem], in_flight: AbstractSet[str] = frozenset()) -> PlannedRound:
    """`in_flight`: problems an earlier round still runs (asynchronous training overlaps rounds); a fresh draw
    skips them as it skips queued ones."""
    queue, cursor = tail.long_queue(), replace(tail.cursor)
    plan = make_round_plan(queue, iteration, settings.prompts_per_step, settings.responses_kept,
                           settings.prompt_ratio, settings.responses_launched, settings.enabled)
    if plan.fresh_prompts > len(problems) - len(queue) - len(in_flight):
        raise ValueError(f"a round launches {plan.fresh_prompts} fresh prompts but the dataset has only "
                         f"{len(problems)} ({len(queue)} of them queued, {len(in_flight)} in flight in earlier "
                         "rounds): lower data.prompts_per_step")
    chosen = [problems_by_id[queued.problem_id] for queued in plan.queued]
    launched_ids: set[str] = set()
    while len(chosen) < plan.fresh_prompts:
        for problem in draw_prompts(problems, cursor, plan.fresh_prompts - len(chosen), settings.data_seed):
            if problem.problem_id not in queue and problem.problem_id not in launched_ids \
                    and problem.problem_id not in in_flight:
                chosen.append(problem)
                launched_ids.add(problem.problem_id)
    return PlannedRound(plan, chosen, TailState(queue=tuple(queue.prompts()), cursor=cursor))


def settle_round(planned: PlannedRound, result: RoundResult, tail: TailState | None = None,
                 defer: bool = True) -> TailState:
    """The tail state after the round: its unfinished prompts join the long-prompt queue (`defer` False: tail.defer,
    they are dropped). `tail`: the state to settle into (default: the one the round was planned with; overlapping
    rounds settle into the latest)."""
    tail = planned.tail if tail is None else tail
    queue = tail.long_queue()
    if defer:
        queue.defer(result.deferred_problem_ids, planned.plan.iteration)
    return TailState(queue=tuple(queue.prompts()), cursor=tail.cursor)
