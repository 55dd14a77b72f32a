"""Greedy accuracy of the current policy on the held-out problems."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.scoring import score_groups
from tailflow.engines.rollout.requests import greedy_requests
from tailflow.engines.run_context import RunContext


@task(cache_policy=NO_CACHE)
def evaluate(ctx: RunContext) -> float:
    problems = ctx.eval_problems
    requests = greedy_requests(problems, ctx.config.rollout.max_new_tokens, ctx.tokenizer, ctx.config.data.prompt_template)
    groups = score_groups(problems, ctx.rollout.generate(requests), ctx.reward, ctx.tokenizer)
    return sum(group.responses[0].correct for group in groups) / len(groups)
