"""Rollout: launch the round's requests and run them under its completion rule."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.launch import RoundRollout, roll_out_round
from tailflow.engines.tail.round import PlannedRound


# Never cached: a cache hit would silently skip the call into a stateful Ray actor.
@task(cache_policy=NO_CACHE)
def run_rollout(ctx: RunContext, planned: PlannedRound, scorer: StreamingScorer) -> RoundRollout:
    """Generate the round; with streamed scoring, `scorer` gets each response as it finishes."""
    ctx.fault_point("rollout", planned.plan.iteration)
    on_finished = scorer.on_finished if scorer.streaming else None
    return roll_out_round(ctx.rollout, planned, ctx.sampling, ctx.tokenizer, ctx.config.data.prompt_template,
                          ctx.config.train.seed, ctx.tail.steps_per_poll, on_finished)
