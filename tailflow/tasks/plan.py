"""Plan the round: short or long (tail batching) or synchronous, and which prompts."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.data.cursor import DataCursor
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.tail.prepare import PreparedRound, prepare_round
from tailflow.engines.tail.queue import LongPromptQueue


@task(cache_policy=NO_CACHE)
def plan_round(ctx: RunContext, state: RunState, iteration: int) -> PreparedRound:
    config = ctx.config
    return prepare_round(
        iteration,
        LongPromptQueue.from_state(state.long_queue),
        DataCursor(**state.cursor.model_dump()),
        ctx.train_problems,
        ctx.problems_by_id,
        prompts_per_step=config.data.prompts_per_step,
        responses_kept=config.rollout.n,
        prompt_ratio=config.tail.prompt_ratio,
        responses_launched=config.responses_launched,
        enabled=config.tail.enabled,
        data_seed=config.data.seed,
    )
