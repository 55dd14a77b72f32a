"""One training iteration: plan -> rollout -> score -> train -> sync weights -> (evaluate) -> commit.

With train.stream the train step starts during rollout (each group once it is scored); `train_policy` then
sends the rest and takes the step. One weight sync per iteration: the version counts iterations, whatever
number of optimizer steps train.ppo_epochs x train.mini_batches takes.

Each line is a step (a Prefect task, or an engine function between two) and
passes that step's typed result on; the metrics row and the next state are
built from those results by `track.summary.metrics_row` and `RunState.advance`.
"""
from __future__ import annotations

from prefect import flow

from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.tail.round import settle_round
from tailflow.engines.track.summary import metrics_row
from tailflow.flows.artifacts import publish_iteration_summary, publish_rollout_membership
from tailflow.tasks.commit import commit
from tailflow.tasks.evaluate import evaluate_policy
from tailflow.tasks.plan import plan_round
from tailflow.tasks.rollout import run_rollout
from tailflow.tasks.score import collect_scores, start_scoring
from tailflow.tasks.sync import sync_weights
from tailflow.tasks.train import start_training, train_policy


@flow(flow_run_name="iter-{iteration:04d}")
def iteration(ctx: RunContext, state: RunState, iteration: int, attempt: int = 0) -> RunState:
    """`state` is the last commit; `attempt` > 0 when an actor died in an earlier try of this iteration."""
    planned = plan_round(ctx, state.tail, iteration)
    scorer = start_scoring(ctx, planned.problems, state.reward_anchors)
    stream = start_training(ctx, scorer, state.weight_version)  # None unless train.stream
    rollout = run_rollout(ctx, planned, scorer, stream)
    scored = collect_scores(ctx, scorer, rollout)
    trained = train_policy(ctx, scored, iteration, state.weight_version, stream)
    synced = sync_weights(ctx, state.weight_version + 1, iteration)
    evaluated = evaluate_policy(ctx) if ctx.config.train.evaluates_after(iteration) else None
    outcome = IterationOutcome(
        iteration, attempt, planned, rollout, scored, trained, synced, evaluated,
        tail=settle_round(planned, rollout.result),
        anchors=ctx.timeouts.updated(state.reward_anchors, scored.observed_times()),
        reports_anchor=ctx.reward.runs_code,
    )
    workers = ctx.rollout.take_membership()  # joins, leaves, migrations (elastic rollout workers)
    row = metrics_row(outcome, state.initial_eval_accuracy) | workers.metrics()
    next_state = commit(ctx, state.advance(outcome, rollout_workers_added=ctx.rollout.workers_added()), row)
    publish_iteration_summary(row, next_state)
    publish_rollout_membership(ctx.run_id, iteration, workers)
    return next_state
