"""Asynchronous training's rollout steps: take a finished round, train while the next ones roll, pause and
resume the rollout around the weight sync (engines/tail/pipeline.py says how the rounds overlap)."""
from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.tail.pipeline import OverlapStats, TakenRound
from tailflow.engines.tail.pipeline_state import PipelineState
from tailflow.tasks.train import start_step
from tailflow.engines.train.trainer import TrainStepStats


@dataclass(frozen=True)
class OverlappedTrainStep:
    trained: TrainStepStats
    overlap: OverlapStats


# Never cached: each of these drives stateful Ray actors.
@task(cache_policy=NO_CACHE)
def take_round(ctx: RunContext, state: RunState, iteration: int) -> TakenRound:
    """Round `iteration`, once its completion rule is done; the rounds after it keep running. A pipeline that is
    not where the last commit left it (a new run, a resumed one, a retried iteration) is restored from that
    commit, read from the store (`state` comes without its pipeline: `RunState.without_pipeline`)."""
    pipeline = ctx.pipeline
    if not pipeline.is_at(iteration):
        committed = read_committed_state(ctx.store, ctx.run_id)
        if committed is None or committed.iteration != iteration:
            raise RuntimeError(f"iteration {iteration} of run {ctx.run_id} must start from the commit after "
                               f"iteration {iteration - 1}, but the store's latest commit is "
                               f"{'none' if committed is None else committed.iteration}")
        pipeline.restore(committed.pipeline or PipelineState(), committed.tail, iteration, committed.weight_version)
    ctx.fault_point("rollout", iteration)
    return pipeline.take(iteration)


@task(cache_policy=NO_CACHE)
def train_while_rolling(ctx: RunContext, scored: ScoredRound, iteration: int, weight_version: int) -> OverlappedTrainStep:
    """One optimizer step on round `iteration` while the rollout runs on: as long as the step takes, or exactly
    `rollout.async_steps_per_train` engine steps (the deterministic mode)."""
    ctx.fault_point("train", iteration)
    pending = start_step(ctx, scored, weight_version, max_staleness=ctx.pipeline.max_staleness)
    overlap = ctx.pipeline.roll_while(pending.ready, ctx.config.rollout.async_steps_per_train)
    return OverlappedTrainStep(pending.result(), overlap)


@task(cache_policy=NO_CACHE)
def pause_rollout(ctx: RunContext, iteration: int) -> int:
    """Stop the requests in flight, keeping their tokens: the engines go idle for the weight sync. Returns how
    many were stopped."""
    ctx.fault_point("sync", iteration)
    return ctx.pipeline.pause()


@task(cache_policy=NO_CACHE)
def resume_rollout(ctx: RunContext, version: int) -> PipelineState:
    """Resubmit them under weights `version`; what is resubmitted is what the commit records."""
    ctx.pipeline.resume(version)
    return ctx.pipeline.snapshot()
