"""Scoring: start a round's scorer, then collect its scores and group them by prompt."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.scoring import ScoredGroup, groups_from_outcomes
from tailflow.engines.reward.streaming import ScoringStats, StreamingScorer
from tailflow.engines.reward.timeouts import TimeoutAnchors
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.run_context import RunContext


def start_scoring(ctx: RunContext, problems: list[Problem], anchors: TimeoutAnchors) -> StreamingScorer:
    """A scorer for one round; every code execution in it gets the timeout the committed anchors imply."""
    timeout_of = (lambda problem: ctx.timeouts.timeout_s(problem, anchors)) if ctx.config.reward.type == "code" \
        else (lambda problem: None)
    return StreamingScorer(ctx.reward_pool, ctx.tokenizer, problems, timeout_of, ctx.config.reward.streaming)


@task(cache_policy=NO_CACHE)
def score(ctx: RunContext, scorer: StreamingScorer, problems: list[Problem], completions: list[Completion]
          ) -> tuple[list[ScoredGroup], ScoringStats]:
    """Wait for the scores still outstanding (all of them, without streaming) and group them by prompt."""
    outcomes, stats = scorer.finish(completions)
    return groups_from_outcomes(problems, completions, outcomes, tokenizer=ctx.tokenizer), stats
