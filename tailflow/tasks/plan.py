"""Plan the round: short or long (tail batching) or synchronous, and which prompts."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.round import PlannedRound, begin_round
from tailflow.engines.tail.state import TailState


@task(cache_policy=NO_CACHE)
def plan_round(ctx: RunContext, tail: TailState, iteration: int) -> PlannedRound:
    """From the committed tail state; the returned plan carries the state after drawing (nothing is committed)."""
    return begin_round(tail, iteration, ctx.tail, ctx.train_problems, ctx.problems_by_id)
