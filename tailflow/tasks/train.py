"""One optimizer step of the policy on the scored groups."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.scoring import ScoredGroup
from tailflow.engines.run_context import RunContext
from tailflow.engines.train.samples import samples_from_groups


@task(cache_policy=NO_CACHE)
def train_step(ctx: RunContext, groups: list[ScoredGroup]):
    samples = samples_from_groups(groups, ctx.config.train.advantage)
    return ctx.trainer.train_step(samples)
