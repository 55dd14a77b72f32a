"""Rollout: the synchronous baseline, every prompt waits for all its responses."""
from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, SamplingParams
from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.rollout.rollout_stats import RolloutStats, summarize_rollout
from tailflow.engines.run_context import RunContext


# Never cached: a cache hit would silently skip the call into a stateful Ray actor.
@task(cache_policy=NO_CACHE)
def rollout(ctx: RunContext, problems: list[Problem], iteration: int) -> tuple[list[Completion], RolloutStats]:
    config = ctx.config
    params = SamplingParams(
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
        max_new_tokens=config.rollout.max_new_tokens,
    )
    requests = sampling_requests(
        problems, config.rollout.n, params, ctx.tokenizer, config.train.seed, iteration, config.data.prompt_template
    )
    before = ctx.rollout.stats()
    started = time.perf_counter()
    completions = ctx.rollout.generate(requests)
    seconds = time.perf_counter() - started
    return completions, summarize_rollout(completions, before, ctx.rollout.stats(), seconds)
