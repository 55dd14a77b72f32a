"""Scoring: collect a round's scores (streamed during rollout, or all now) and group them by prompt."""
from __future__ import annotations

from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.round_work import RoundWork
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.taken import TakenRound
from tailflow.tasks.cancellable import run_task


@run_task
def collect_scores(ctx: RunContext, taken: TakenRound) -> ScoredRound:
    """Wait for the scores still outstanding (all of them, without streaming) and group them by prompt."""
    ctx.fault_point("reward", taken.iteration)
    observer = taken.observer_as(RoundWork)
    return observer.scorer.score_round(taken.problems, taken.completions)
