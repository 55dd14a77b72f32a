"""The parent flow of a run: set up (or resume), evaluate, iterate, summarise."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from tailflow.config import FLOW_OVERRIDES, ConfigError, RunConfig, flow_run_config
from tailflow.driver.artifacts import TABLE_ROWS, RunArtifacts
from tailflow.driver.cancel import end_left_subflows, ended_on_cancel
from tailflow.driver.context import build_context, new_run_id, prepare_run_dir, restart_workers
from tailflow.driver.live_progress import live_progress
from tailflow.driver.prefect_outage import complete_committed_subflow, is_prefect_outage, wait_for_prefect_api
from tailflow.driver.garbage import collect_iteration_garbage, iteration_garbage_collected
from tailflow.driver.prefect_services import forget_dead_results, release_stopped_services
from tailflow.driver.preflight import check_inputs
from tailflow.driver.resume import (check_config_for_resume, commit_initial_state, finished_state, restore_commit,
                                    restore_weights, resume_config)
from tailflow.driver.retry_policy import no_retry_on_user_error
from tailflow.driver.run_hooks import after_iteration, publish_report
from tailflow.driver.run_log import flow_run_run_id, print_resume, print_start, say
from tailflow.driver.workers import shutdown_workers
from tailflow.driver.writer import run_writer
from tailflow.engines.cluster import ACTOR_FAILURES
from tailflow.engines.run_state import RunState
from tailflow.engines.run_context import RunContext
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.runs.layout import RunError, config_key, metrics_key
from tailflow.engines.store import open_store
from tailflow.engines.track import MetricsLogger
from tailflow.engines.cluster.placement import takes_turns
from tailflow.engines.cluster.worker_control import WorkerCommand, send_worker_command
from tailflow.flows.iteration import iteration
from tailflow.tasks.cancellable import cancel_requested, subflow_end_deferred
from tailflow.tasks.evaluate import evaluate_policy


def default_run_id() -> str:
    """The flow run's own id when the caller gave none: the same on every retry of that flow run."""
    return flow_run_run_id(flow_run.id) if flow_run.id else new_run_id()


def run_name() -> str:
    return flow_run.parameters.get("run_id") or default_run_id()


@dataclass(frozen=True)
class EnvSummary:
    turns_mean: float
    """Turns per kept trajectory, over every iteration's."""
    step_s_mean: float
    """Mean of the iterations' `time/env_step_s_mean`."""
    failures: int
    """Failed environment resets and steps, every iteration's."""


def env_summary(rows: list[dict[str, Any]]) -> EnvSummary | None:
    """From the metrics rows of an agentic run (those with `env/turns_mean`); None when no row has them."""
    rows = [row for row in rows if row.get("env/turns_mean") is not None]
    if not rows:
        return None
    return EnvSummary(sum(row["env/turns_mean"] for row in rows) / len(rows),
                      sum(row["time/env_step_s_mean"] for row in rows) / len(rows),
                      sum(row["env/failures"] for row in rows))


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    run_dir: str
    iterations: int
    initial_accuracy: float
    final_accuracy: float | None
    mean_step_seconds: float
    latest_checkpoint: str | None
    metrics_path: str
    env: EnvSummary | None = None
    """An agentic run's environments over its iterations; None: single-turn."""


@flow(name="rl_training", flow_run_name=run_name, retries=2, retry_delay_seconds=10,
      on_cancellation=[end_left_subflows],  # an iteration the run's process could not end (driver/cancel.py)
      persist_result=False)  # whether an iteration ran comes from the run's store, never Prefect's results
def rl_training(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    config: RunConfig | None = None,
    allow_change: list[str] | None = None,
    resume: bool = False,
    take_over: bool = False,
) -> RunSummary:
    """Train a policy with RL, or continue run `run_id` from its last commit.

    The config comes from a YAML file plus overrides, or a whole `RunConfig` (a dict is validated into
    one; typed so that a deployment's parameter schema, and the UI's form, are the config's own). A retry of this
    flow run (Prefect's `retries`, or Retry in the UI) resumes the same way: the
    run id is fixed by the first attempt (the flow run's id when none is given).
    `resume=True` insists on an existing run and, unless a config is given, uses
    the run's saved config with `overrides` on top (as `tailflow resume`). `take_over=True` takes the
    run's lease from a writer that still holds it (docs/operations.md, one writer per run).
    """
    with no_retry_on_user_error():
        if resume:
            run_config, allow_change = config_to_resume(config_path, overrides or [], config, run_id, allow_change)
        else:
            run_config = flow_run_config(config_path, overrides or [], config)
        run_id = run_id or default_run_id()
        store = open_store(run_config.storage.uri)
        finished = finished_state(store, run_id, run_config, allow_change or [])
        if finished is not None:  # e.g. a scheduled resume of a run that ended: no Ray, no workers
            return summarize(store, finished, MetricsLogger(store, run_id).rows())
        check_inputs(run_config)
    with (no_retry_on_user_error(), run_writer(run_config, run_id, take_over) as lease,
          live_progress(run_config, run_id) as live):
        return train(run_config, run_id, allow_change or [], lease, live)


@flow(name="rollout_workers", flow_run_name="workers-{run_id}", persist_result=False)
def rollout_workers(run_id: str, add: int = 0, remove: int | None = None, config_path: str | None = None,
                    overrides: list[str] | None = None) -> str:
    """Add `add` rollout workers to running run `run_id`, or remove worker `remove` (as `tailflow workers
    add/remove`): the command is queued in the run's store (`storage.uri` of the config given) and the run applies
    it between rollout polls. Returns where the command was written."""
    with no_retry_on_user_error():
        store = open_store(flow_run_config(config_path, overrides or [], None).storage.uri)
        try:
            command = WorkerCommand(add=add, remove=remove)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if not store.exists(config_key(run_id)):
            raise ConfigError(f"run_id: no run {run_id!r} in {store.uri()}")
        return store.uri(send_worker_command(store, run_id, command))


def train(run_config: RunConfig, run_id: str, allow_change: list[str], lease, live) -> RunSummary:
    store = open_store(run_config.storage.uri)
    committed = read_committed_state(store, run_id)
    if committed is not None:
        check_config_for_resume(store, run_id, run_config, allow_change, committed)
    else:
        prepare_run_dir(store, run_config, run_id)
    ctx = build_context(run_config, run_id, store, watch=live.watcher,
                        workers_added=committed.rollout_workers_added if committed is not None else 0)
    try:
        if committed is not None:
            restore_commit(ctx, committed)
            state = committed
            print_resume(ctx, state)
        else:
            state = commit_initial_state(ctx, evaluate_policy(ctx).accuracy)
            print_start(ctx, state)
        rollout_first(ctx)
        artifacts = RunArtifacts(run_id, run_config.train.iterations)
        artifacts.progress(state.iteration)
        if ctx.metrics.wandb_run is not None:
            artifacts.wandb_link(ctx.metrics.wandb_run)
        attempt_started = datetime.now(timezone.utc)  # a Cancel ends this attempt's subflows, not earlier ones
        with iteration_garbage_collected():
            for step in range(state.iteration, run_config.train.iterations):
                # the hooks too: a Cancel's signal lands as often while the report of a committed step is drawn
                with ended_on_cancel(ctx.store, run_id, run_config.storage.uri, step, since=attempt_started):
                    ctx, state = run_iteration(ctx, state, step)
                    release_stopped_services()  # prefect 3.8.8 keeps each stopped events worker otherwise
                    forget_dead_results()  # and each iteration's dependency-tracking entries, for the whole run
                    rows = list(ctx.metrics.recent)[-TABLE_ROWS:]  # not metrics.jsonl: it grows with the run
                    after_iteration(ctx, state, rows[-1], lease, live)
                    artifacts.progress(state.iteration)
                    artifacts.metrics(rows)
                    artifacts.checkpoint_link(ctx.store, state.latest_checkpoint, step,
                                              run_config.storage.link_expiry_s)
                    collect_iteration_garbage()  # the iteration's reference cycles, now: driver/garbage.py
        publish_report(ctx)
        return summarize(ctx.store, state, ctx.metrics.rows())
    finally:
        shutdown_workers(ctx)
        ctx.metrics.close()


def config_to_resume(config_path: str | None, overrides: list[str], config: RunConfig | dict | None,
                     run_id: str | None, allow_change: list[str] | None) -> tuple[RunConfig, list[str]]:
    """The config a `resume=True` flow run continues with, and the keys it may change (`resume_config`, as
    `tailflow resume`); the run must exist and have committed. A refusal is a ConfigError, which no retry of the
    flow run repeats (driver/retry_policy.py)."""
    if not run_id:
        raise ConfigError("run_id: resume=True needs the id of the run to resume")
    try:
        return resume_config(run_id, config_path, overrides, allow_change or [], config, FLOW_OVERRIDES)
    except RunError as error:
        raise ConfigError(str(error)) from None


def run_iteration(ctx: RunContext, state: RunState, step: int) -> tuple[RunContext, RunState]:
    """One iteration; if an actor dies in it, every actor is replaced, the last commit restored, and the
    iteration runs again from its start (up to `train.iteration_retries` times). The context returned holds
    the workers in use after it. With `rollout.elastic` (the default) a rollout worker's death never gets here:
    its group replaces it and moves its requests (docs/operations.md, elastic rollout workers).

    The same when the Prefect server stopped answering long enough for a request of the iteration's subflow to
    fail (`driver/prefect_outage.py`), once it answers again: the actors are replaced then too, because the failed
    iteration may have left a round half generated in them."""
    retries = ctx.config.train.iteration_retries
    for attempt in range(retries + 1):
        try:
            tried = datetime.now(timezone.utc)
            with subflow_end_deferred():  # a signal held from its commit to its return stops the run here
                return ctx, iteration(ctx, state.without_pipeline(), step, attempt)
        except Exception as error:
            outage = is_prefect_outage(error)
            if not (outage or isinstance(error, ACTOR_FAILURES)):
                raise
            if attempt == retries or (not outage and cancel_requested()):  # a Cancel stops Ray: nothing to restart
                shutdown_workers(ctx)  # the caller's context may hold the workers this replaced
                raise
            if outage:
                say(f"[tailflow] iter {step:04d}: the Prefect server did not answer ({type(error).__name__}); "
                    "waiting for it")
                waited = wait_for_prefect_api()
                committed = read_committed_state(ctx.store, ctx.run_id)
                if committed is not None and committed.iteration > step:  # it failed after its commit
                    line = (f"[tailflow] iter {step:04d}: the Prefect server answers again (waited {waited:.0f} s); "
                            "the iteration was committed before it failed: restarting the workers from that commit")
                    say(line)
                    complete_committed_subflow(step, tried, line)
                    ctx = restart_workers(ctx)
                    restore_weights(ctx, committed)
                    rollout_first(ctx)
                    return ctx, committed
                say(f"[tailflow] iter {step:04d}: the Prefect server answers again (waited {waited:.0f} s); "
                    f"restarting the workers from the last commit and running the iteration again "
                    f"(attempt {attempt + 2})")
            else:
                say(f"[tailflow] iter {step:04d}: an actor died ({type(error).__name__}); restarting the workers "
                    f"from the last commit and running the iteration again (attempt {attempt + 2})")
            ctx = restart_workers(ctx)
            restore_weights(ctx, state)
            rollout_first(ctx)
    raise AssertionError("unreachable")


def rollout_first(ctx: RunContext) -> None:
    """An iteration starts with its rollout: where the phases take turns on shared GPUs, the trainer's state
    waits in host memory until the step (`placement.takes_turns`), and so does a critic's."""
    if takes_turns(ctx.config):
        ctx.trainer.offload()
        if ctx.critic is not None:
            ctx.critic.offload()


def summarize(store, state: RunState, rows: list[dict[str, Any]]) -> RunSummary:
    """`rows`: the run's metrics rows, as committed."""
    return RunSummary(
        run_id=state.run_id,
        run_dir=store.uri(state.run_id),
        iterations=state.iteration,
        initial_accuracy=state.initial_eval_accuracy,
        final_accuracy=state.last_eval_accuracy,
        mean_step_seconds=sum(r["time/step_total"] for r in rows) / max(len(rows), 1),
        latest_checkpoint=store.uri(state.latest_checkpoint) if state.latest_checkpoint else None,
        metrics_path=store.uri(metrics_key(state.run_id)),
        env=env_summary(rows),
    )
