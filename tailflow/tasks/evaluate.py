"""Greedy accuracy of the current policy on the held-out problems."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.scoring import groups_from_outcomes
from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.rollout.requests import greedy_requests
from tailflow.engines.run_context import RunContext


@task(cache_policy=NO_CACHE)
def evaluate(ctx: RunContext) -> float:
    """Scored on the reward workers after generation; code runs with the fixed `reward.timeout_max_s`."""
    problems = ctx.eval_problems
    requests = greedy_requests(problems, ctx.config.rollout.max_new_tokens, ctx.tokenizer, ctx.config.data.prompt_template)
    completions = ctx.rollout.generate(requests)
    timeout_s = ctx.config.reward.timeout_max_s if ctx.config.reward.type == "code" else None
    scorer = StreamingScorer(ctx.reward_pool, ctx.tokenizer, problems, lambda problem: timeout_s, streaming=False)
    outcomes, _ = scorer.finish(completions)
    groups = groups_from_outcomes(problems, completions, outcomes, tokenizer=ctx.tokenizer)
    return sum(group.responses[0].correct for group in groups) / len(groups)
