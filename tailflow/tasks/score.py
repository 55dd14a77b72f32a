"""Scoring: start a round's scorer, then collect its scores and group them by prompt."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.reward.timeouts import TimeoutAnchors
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.roll_out import RoundRollout


def start_scoring(ctx: RunContext, problems: list[Problem], anchors: TimeoutAnchors) -> StreamingScorer:
    """A scorer for one round; every code test in it gets the timeout the committed anchors imply."""
    timeout_of = (lambda problem: ctx.timeouts.timeout_s(problem, anchors)) if ctx.reward.runs_code \
        else (lambda problem: None)
    return StreamingScorer(ctx.reward_pool, ctx.tokenizer, problems, timeout_of, ctx.config.reward.streaming)


@task(cache_policy=NO_CACHE)
def collect_scores(ctx: RunContext, scorer: StreamingScorer, rollout: RoundRollout) -> ScoredRound:
    """Wait for the scores still outstanding (all of them, without streaming) and group them by prompt."""
    ctx.fault_point("reward", rollout.iteration)
    return scorer.score_round(rollout.problems, rollout.completions)
