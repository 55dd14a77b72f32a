"""One training iteration: plan -> rollout -> score -> train_step -> sync_weights -> (eval) -> commit."""
from __future__ import annotations

import time

from prefect import flow

from tailflow.engines.faults import fault_point
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import CursorState, RunState
from tailflow.engines.track.summary import iteration_metrics, tail_metrics
from tailflow.flows.artifacts import publish_iteration_summary
from tailflow.tasks.commit import commit
from tailflow.tasks.evaluate import evaluate
from tailflow.tasks.plan import plan_round
from tailflow.tasks.rollout import rollout
from tailflow.tasks.score import score, start_scoring
from tailflow.tasks.sync import sync_weights
from tailflow.tasks.train import train_step


@flow(flow_run_name="iter-{iteration:04d}")
def iteration(ctx: RunContext, state: RunState, iteration: int, attempt: int = 0) -> RunState:
    """`state` is the last commit; `attempt` > 0 when an actor died in an earlier try of this iteration."""
    faults = fault_injection(ctx, iteration)
    started = time.perf_counter()
    prepared = plan_round(ctx, state, iteration)
    scorer = start_scoring(ctx, prepared.problems, state.reward_anchors)
    faults("rollout")
    round_result, rollout_stats = rollout(ctx, prepared, scorer)
    t_reward = time.perf_counter()
    problems, completions = round_result.trained_in_launch_order(prepared.problems)
    faults("reward")
    groups, scoring_stats = score(ctx, scorer, problems, completions)
    t_train = time.perf_counter()
    faults("train")
    train_stats = train_step(ctx, groups, state.weight_version)
    t_sync = time.perf_counter()
    faults("sync")
    sync_weights(ctx, state.weight_version + 1)
    t_done = time.perf_counter()

    config = ctx.config
    is_last = iteration == config.train.iterations - 1
    accuracy = evaluate(ctx) if is_last or (iteration + 1) % config.train.eval_every == 0 else None
    timings = {
        "time/eval": time.perf_counter() - t_done,
        "time/step_reward": t_train - t_reward,
        "time/step_train": t_sync - t_train,
        "time/step_model_update": t_done - t_sync,
        "time/step_total": t_done - started,
    }
    prepared.queue.defer(round_result.deferred_problem_ids, iteration)
    row = iteration_metrics(iteration, groups, rollout_stats, train_stats, timings, accuracy)
    row.update(tail_metrics(prepared.plan, prepared.queue, round_result))
    row.update(scoring_stats.metrics())
    anchors = ctx.timeouts.updated(state.reward_anchors, [(group.problem, response.correct, response.exec_s)
                                                          for group in groups for response in group.responses])
    if ctx.config.reward.type == "code":
        row["reward/timeout_anchor_s"] = anchors.task_s
    row["iteration/attempt"] = attempt
    if iteration == 0:
        row["eval/accuracy_initial"] = state.initial_eval_accuracy
    next_state = state.model_copy(
        update={
            "iteration": iteration + 1,
            "weight_version": state.weight_version + 1,
            "cursor": CursorState(**prepared.cursor.__dict__),
            "long_queue": prepared.queue.to_state(),
            "last_eval_accuracy": accuracy if accuracy is not None else state.last_eval_accuracy,
            "round_history": [*state.round_history, int(row["tail/round"])],
            "reward_anchors": anchors,
        }
    )
    next_state = commit(ctx, next_state, row)
    publish_iteration_summary(row, next_state)
    return next_state


def fault_injection(ctx: RunContext, iteration: int):
    """`faults(phase)`: the crash points of engines/faults.py (no-ops unless TAILFLOW_FAULT is set)."""
    actors = {"kill-rollout": lambda: ctx.rollout.worker_pid(0), "kill-trainer": lambda: ctx.trainer.worker_pid(0),
              "kill-reward": lambda: ctx.reward_pool.worker_pid(0)}
    return lambda phase: fault_point(phase, iteration, actors)
