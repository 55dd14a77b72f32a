"""One asynchronous training iteration (`rollout.async_ratio` > 0): take round i, score it, train on it while
the next rounds roll out, sync weights between the rollout's pause and resume, (evaluate), commit.

Still one `iter-NNNN` subflow per optimizer step; the rollout itself runs on in the rollout actors across
iterations (engines/tail/pipeline.py), and the commit records the rounds and requests in flight.
"""
from __future__ import annotations

from prefect import flow

from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.track.async_summary import async_metrics
from tailflow.engines.track.summary import metrics_row
from tailflow.flows.artifacts import publish_iteration_summary, publish_rollout_membership
from tailflow.tasks.async_rollout import pause_rollout, resume_rollout, take_round, train_while_rolling
from tailflow.tasks.commit import commit
from tailflow.tasks.evaluate import evaluate_policy
from tailflow.tasks.score import collect_scores, start_scoring
from tailflow.tasks.sync import sync_weights


@flow(flow_run_name="iter-{iteration:04d}")
def async_iteration(ctx: RunContext, state: RunState, iteration: int, attempt: int = 0) -> RunState:
    """`state` is the last commit; `attempt` > 0 when an actor died in an earlier try of this iteration."""
    taken = take_round(ctx, state, iteration)
    scorer = start_scoring(ctx, taken.rollout.problems, state.reward_anchors)
    scored = collect_scores(ctx, scorer, taken.rollout)
    step = train_while_rolling(ctx, scored, iteration, state.weight_version)
    stopped = pause_rollout(ctx, iteration)
    synced = sync_weights(ctx, state.weight_version + 1, iteration)
    evaluated = evaluate_policy(ctx) if ctx.config.train.evaluates_after(iteration) else None
    in_flight = resume_rollout(ctx, synced.version)
    outcome = IterationOutcome(
        iteration, attempt, taken.planned, taken.rollout, scored, step.trained, synced, evaluated,
        tail=ctx.pipeline.tail,
        anchors=ctx.timeouts.updated(state.reward_anchors, scored.observed_times()),
        reports_anchor=ctx.reward.runs_code,
    )
    workers = ctx.rollout.take_membership()  # joins, leaves, migrations (elastic rollout workers)
    row = metrics_row(outcome, state.initial_eval_accuracy) | async_metrics(taken, step.overlap, stopped) \
        | workers.metrics()
    next_state = commit(ctx, state.advance(outcome, pipeline=in_flight,
                                                rollout_workers_added=ctx.rollout.workers_added()), row)
    publish_iteration_summary(row, next_state)
    publish_rollout_membership(ctx.run_id, iteration, workers)
    return next_state
