"""Rollout: launch the round's requests and run them under its completion rule."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.reward.streaming import StreamingScorer
from tailflow.engines.run_context import RunContext
from tailflow.engines.sim.recorder import TraceRecorder
from tailflow.engines.sim.trace_log import RolloutTraceLog
from tailflow.engines.tail.roll_out import RoundRollout, roll_out_round
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.train.stream import StreamedStep


# Never cached: a cache hit would silently skip the call into a stateful Ray actor.
@task(cache_policy=NO_CACHE)
def run_rollout(ctx: RunContext, planned: PlannedRound, scorer: StreamingScorer,
                stream: StreamedStep | None = None) -> RoundRollout:
    """Generate the round; with streamed scoring, `scorer` gets each response as it finishes, and with the
    stream trainer (`stream`), the trainer each completed prompt's group once it is scored. With
    `storage.rollout_trace`, the round's trace (every response's length, finish step, kept or aborted) is
    appended to the run's rollout_trace.jsonl, for the simulator."""
    ctx.fault_point("rollout", planned.plan.iteration)
    on_finished = scorer.on_finished if scorer.streaming else None
    on_completed = stream.on_completed if stream is not None else None
    recorder = TraceRecorder(ctx.rollout)
    rollout = roll_out_round(recorder, planned, ctx.sampling, ctx.tokenizer, ctx.config.data.prompt_template,
                             ctx.config.train.seed, ctx.tail.steps_per_poll, on_finished, on_completed)
    if ctx.config.storage.rollout_trace:
        RolloutTraceLog(ctx.store, ctx.run_id).append(recorder.round_trace(
            rollout.iteration, planned.plan.kind.value, rollout.requests, rollout.result,
            ctx.sampling.max_new_tokens, rollout.stats.seconds))
    return rollout
