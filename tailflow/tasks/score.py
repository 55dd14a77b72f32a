"""Score every response of the round and group them by prompt."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.scoring import ScoredGroup, score_groups
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.run_context import RunContext


@task(cache_policy=NO_CACHE)
def score(ctx: RunContext, problems: list[Problem], completions: list[Completion]) -> list[ScoredGroup]:
    return score_groups(problems, completions, ctx.reward, ctx.tokenizer)
