"""One training iteration, in every mode: take the round -> score -> train -> pause rollout -> sync weights ->
(evaluate) -> resume rollout -> commit.

Synchronous (rollout.async_ratio 0), `take_round` rolls the round out now (tail batching or not) and pause /
resume have nothing in flight; with train.stream the step was fed during rollout. Asynchronous, the round was
launched earlier and the next ones roll out while this one trains; the weight sync stops them and resubmits
them, and the commit records them. One weight sync per iteration: the version counts iterations, whatever number
of optimizer steps train.ppo_epochs x train.mini_batches takes.

Each line is a step (a Prefect task, or an engine function between two) and passes that step's typed result
on; the metrics row and the next state are built from those results by `track.summary.metrics_row` and
`RunState.advance`.
"""
from __future__ import annotations

from prefect import flow

from tailflow.driver.artifacts import publish_iteration_summary, publish_rollout_membership
from tailflow.driver.cancel import aborted_on_cancel
from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.round_work import RoundWork
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.track.summary import metrics_row
from tailflow.tasks.cancellable import deferred_to_return
from tailflow.tasks.commit import commit
from tailflow.tasks.evaluate import evaluate_policy
from tailflow.tasks.rollout import pause_rollout, resume_rollout, take_round
from tailflow.tasks.score import collect_scores
from tailflow.tasks.sync import sync_weights
from tailflow.tasks.train import train_policy


@flow(flow_run_name="iter-{iteration:04d}", persist_result=False)
def iteration(ctx: RunContext, state: RunState, iteration: int, attempt: int = 0) -> RunState:
    """`state` is the last commit; `attempt` > 0 when an actor died in an earlier try of this iteration."""
    with aborted_on_cancel():  # a Cancel stops the subflow without a crash report (driver/cancel.py)
        taken = take_round(ctx, state, iteration)
        scored = collect_scores(ctx, taken)
        trained = train_policy(ctx, scored, taken.observer_as(RoundWork), iteration, state.weight_version)
        stopped = pause_rollout(ctx)
        synced = sync_weights(ctx, state.weight_version + 1, iteration)
        evaluated = evaluate_policy(ctx) if ctx.config.train.evaluates_after(iteration) else None
        in_flight = resume_rollout(ctx, synced.version)
        outcome = IterationOutcome(
            iteration, attempt, taken, scored, trained.stats, trained.overlap, stopped, synced, evaluated,
            tail=ctx.pipeline.tail,
            anchors=ctx.timeouts.updated(state.reward_anchors, scored.observed_times()),
            reports_anchor=ctx.reward.runs_code, is_async=ctx.pipeline.is_async,
            env_counters=env_counters(ctx),
        )
        workers = ctx.rollout.take_membership()  # joins, leaves, migrations (elastic rollout workers)
        row = metrics_row(outcome, state.initial_eval_accuracy) | workers.metrics()
        next_state = commit(ctx, state.advance(outcome, pipeline=in_flight,
                                               rollout_workers_added=ctx.rollout.workers_added()), row)
        deferred_to_return()  # committed: a Cancel's signal from here stops the run in its flow, not in this one's end
        publish_iteration_summary(row, next_state)
        publish_rollout_membership(ctx.run_id, iteration, workers)
        return next_state


def env_counters(ctx: RunContext):
    """An agentic run's environment counts over this iteration (None: no environment workers, single-turn)."""
    env_group = getattr(ctx.rollout, "env_group", None)
    return env_group.counters_since_last_read() if env_group is not None else None
