"""Rollout: launch the round's requests and run them under its completion rule."""
from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.rollout.protocol import SamplingParams
from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.rollout.rollout_stats import RolloutStats, summarize_rollout
from tailflow.engines.run_context import RunContext
from tailflow.engines.sim.recorder import TraceRecorder
from tailflow.engines.sim.trace_log import RolloutTraceLog
from tailflow.engines.tail.completion import RoundResult, rule_for
from tailflow.engines.tail.driver import run_round
from tailflow.engines.tail.prepare import PreparedRound


# Never cached: a cache hit would silently skip the call into a stateful Ray actor.
@task(cache_policy=NO_CACHE)
def rollout(ctx: RunContext, prepared: PreparedRound, scorer: StreamingScorer) -> tuple[RoundResult, RolloutStats]:
    """Generate the round; with streamed scoring, `scorer` gets each response as it finishes."""
    config = ctx.config
    params = SamplingParams(
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
        max_new_tokens=config.rollout.max_new_tokens,
    )
    plan = prepared.plan
    requests = sampling_requests(prepared.problems, plan.responses_per_prompt, params, ctx.tokenizer,
                                 config.train.seed, plan.iteration, config.data.prompt_template)
    before = ctx.rollout.stats()
    recorder = TraceRecorder(ctx.rollout)
    started = time.perf_counter()
    on_finished = scorer.on_finished if scorer.streaming else None
    result = run_round(recorder, requests, rule_for(plan, requests), config.tail.steps_per_poll, on_finished)
    seconds = time.perf_counter() - started
    if config.storage.rollout_trace:
        RolloutTraceLog(ctx.store, ctx.run_id).append(
            recorder.round_trace(plan.iteration, plan.kind.value, requests, result, params.max_new_tokens, seconds))
    kept = [completion for _, completions in result.completed for completion in completions]
    return result, summarize_rollout(kept, before, ctx.rollout.stats(), seconds)
