"""Rollout: take the iteration's round from the pipeline; stop and resume the rollout around the weight sync.

One module for every mode (engines/tail/pipeline.py): a synchronous round is rolled out when it is taken; an
asynchronous one was launched earlier and the rounds after it keep running.
"""
from __future__ import annotations

from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.pipeline_state import PipelineState
from tailflow.engines.tail.taken import TakenRound
from tailflow.engines.track.rollout_trace import RolloutTraceLog, trace_of
from tailflow.tasks.cancellable import run_task


@run_task
def take_round(ctx: RunContext, state: RunState, iteration: int) -> TakenRound:
    """Round `iteration`, once its completion rule is done, from the pipeline where the last commit (`state`)
    left it; with `storage.rollout_trace` its trace row is appended to the run's rollout_trace.jsonl."""
    pipeline = pipeline_at_last_commit(ctx, state, iteration)
    taken = take_from(pipeline, ctx, iteration)
    append_trace(ctx, taken)
    return taken


def pipeline_at_last_commit(ctx: RunContext, state: RunState, iteration: int) -> RolloutPipeline:
    """The pipeline, its rounds launched from here on scored with `state`'s timeout anchors. One that is not
    where the last commit left it (a new run, a resumed one, a retried iteration) is restored from that commit,
    read from the store (`state` comes without its pipeline: `RunState.without_pipeline`)."""
    pipeline = ctx.pipeline
    pipeline.observe_with(ctx.round_work.launching_from(state.reward_anchors))
    if not pipeline.is_at(iteration):
        committed = read_committed_state(ctx.store, ctx.run_id)
        if committed is None or committed.iteration != iteration:
            raise RuntimeError(f"iteration {iteration} of run {ctx.run_id} must start from the commit after "
                               f"iteration {iteration - 1}, but the store's latest commit is "
                               f"{'none' if committed is None else committed.iteration}")
        pipeline.restore(committed.pipeline or PipelineState(), committed.tail, iteration, committed.weight_version)
    return pipeline


def take_from(pipeline: RolloutPipeline, ctx: RunContext, iteration: int) -> TakenRound:
    """Drive the engines until round `iteration`'s completion rule is done and take it (after the rollout's
    crash point, engines/faults.py)."""
    ctx.fault_point("rollout", iteration)
    return pipeline.take(iteration)


def append_trace(ctx: RunContext, taken: TakenRound) -> None:
    """With `storage.rollout_trace`, `taken`'s trace row (every launched response's length, finish step, kept
    or aborted) is appended to the run's rollout_trace.jsonl."""
    if ctx.config.storage.rollout_trace:
        RolloutTraceLog(ctx.store, ctx.run_id).append(trace_of(taken, ctx.sampling.max_new_tokens))


@run_task
def pause_rollout(ctx: RunContext) -> int:
    """Stop the requests in flight, keeping their tokens: the engines go idle for the weight sync. Returns how
    many were stopped (none in a synchronous run)."""
    return ctx.pipeline.pause()


@run_task
def resume_rollout(ctx: RunContext, version: int) -> PipelineState | None:
    """Resubmit them under weights `version`; what is resubmitted, with the rounds running ahead, is what the
    commit records (None: nothing, as in every synchronous run)."""
    ctx.pipeline.resume(version)
    snapshot = ctx.pipeline.snapshot()
    return None if snapshot.is_empty else snapshot
