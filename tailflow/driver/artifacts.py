"""Prefect artifacts: what a person browsing the UI sees of each iteration."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from tailflow.driver.links import checkpoint_file, publish_file_link
from tailflow.driver.run_log import tolerated
from tailflow.engines.run_state import RunState

SHOWN = (
    "time/step_total", "time/step_generate", "time/step_reward", "time/step_train", "time/step_model_update",
    "reward/mean", "reward/accuracy", "token/response_length/mean", "token/response_length/max",
    "rollout/bubble_ratio", "tail/round", "tail/long_queue_size", "tail/aborted_requests", "tail/wasted_tokens",
    "tail/kept_length_mean", "tail/completed_length_mean", "tail/launched_length_mean",
    "time/reward_overlap_ratio", "time/reward_workers", "reward/timeouts", "actor/pg_loss", "actor/grad_norm", "eval/accuracy",
)


def iteration_markdown(row: dict[str, Any], state: RunState) -> str:
    round_type = {0: "short round", 1: "long round"}.get(row.get("tail/round"), "synchronous round")
    lines = [f"# {state.run_id} · iteration {row['iteration']} · {round_type}", "", "| metric | value |",
             "| --- | --- |"]
    for name in SHOWN:
        if row.get(name) is not None:
            value = row[name]
            lines.append(f"| `{name}` | {value:.4g} |" if isinstance(value, float) else f"| `{name}` | {value} |")
    queue = state.tail.queue
    lines += ["", f"Long-prompt queue: {len(queue)} prompts"]
    if queue:
        lines += ["", "| oldest queued | times deferred | first deferred at |", "| --- | --- | --- |"]
        lines += [f"| `{entry.problem_id}` | {entry.times_deferred} | {entry.first_deferred_iteration} |"
                  for entry in queue[:5]]
    lines += staleness_lines(row, state)
    lines += environment_lines(row)
    lines += ["", f"Latest checkpoint: `{state.latest_checkpoint or 'none yet'}`"]
    return "\n".join(lines)


def staleness_lines(row: dict[str, Any], state: RunState) -> list[str]:
    """Asynchronous runs: how many weight versions behind the trained responses were, and what runs ahead."""
    lags = sorted((int(name.rsplit("/", 1)[1]), count) for name, count in row.items()
                  if name.startswith("async/staleness/"))
    if not lags:
        return []
    lines = ["", "Staleness of the trained responses (versions between the weights that trained them and their "
             "oldest token):", "", "| versions behind | responses |", "| --- | --- |"]
    lines += [f"| {lag} | {count} |" for lag, count in lags]
    if state.pipeline is not None:
        lines += ["", f"Running ahead: {len(state.pipeline.rounds)} rounds, {len(state.pipeline.in_flight)} "
                      f"requests in flight (resubmitted after the weight sync)"]
    return lines


def environment_lines(row: dict[str, Any]) -> list[str]:
    """Agentic runs: turns per trajectory, how trajectories ended, the environments' time and failures."""
    if row.get("env/turns_mean") is None:
        return []
    lines = ["", f"Environment: {row['env/turns_mean']:.2f} turns per trajectory (max {row['env/turns_max']}), "
                 f"{row['time/env_step_s_mean'] * 1000:.1f} ms per step, {row['env/failures']} failed calls, "
                 f"{row['env/invalid_actions']} invalid actions, {row['env/cut_observations']} observations cut, "
                 f"{row['env/dropped']} kept trajectories not trained", "",
             "| stop reason | kept | all ended |", "| --- | --- | --- |"]
    reasons = [name.rsplit("/", 1)[1] for name in row if name.startswith("env/stop_all/")]
    lines += [f"| `{reason}` | {row.get(f'env/stop/{reason}', 0)} | {row[f'env/stop_all/{reason}']} |"
              for reason in reasons if row.get(f"env/stop/{reason}") or row[f"env/stop_all/{reason}"]]
    return lines


def publish_iteration_summary(row: dict[str, Any], state: RunState) -> None:
    with tolerated("the iteration's artifact"):
        create_markdown_artifact(
            key=f"{artifact_key(state.run_id)}-iteration",
            markdown=iteration_markdown(row, state),
            description=f"iteration {row['iteration']} of run {state.run_id}",
        )


def membership_markdown(run_id: str, iteration: int, changes: Any) -> str:
    """An elastic rollout group's iteration (`cluster/membership_log.py` `MembershipChanges`): the workers, their
    tokens/s, and every join, leave, loss and migration in order."""
    lines = [f"# {run_id} · iteration {iteration} · rollout workers", "", "| metric | value |", "| --- | --- |"]
    for name, value in changes.metrics().items():
        lines.append(f"| `{name}` | {value:.4g} |" if isinstance(value, float) else f"| `{name}` | {value} |")
    lines += ["", "Joins, leaves and migrations:" if changes.events else "No worker joined or left.", ""]
    lines += [f"- `{event.line()}`" for event in changes.events]
    return "\n".join(lines)


def publish_rollout_membership(run_id: str, iteration: int, changes: Any) -> None:
    with tolerated("the rollout workers' artifact"):
        create_markdown_artifact(
            key=f"{artifact_key(run_id)}-rollout-workers",
            markdown=membership_markdown(run_id, iteration, changes),
            description=f"rollout workers in iteration {iteration} of run {run_id}: joins, leaves, migrations",
        )


def artifact_key(run_id: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in run_id.lower())
    return cleaned.strip("-") or "run"


# ---- run-level artifacts (the parent flow run's page) ---------------------------------------------

TABLE_COLUMNS = ("iteration", "tail/round", "time/step_total", "time/step_generate", "time/step_reward",
                 "time/step_train", "reward/mean", "reward/accuracy", "token/response_length/mean",
                 "token/response_length/max", "tail/long_queue_size", "time/reward_overlap_ratio", "eval/accuracy")


TABLE_ROWS = 20
"""Iterations in the metrics table artifact: each version of it is stored by the server (measured: 279 KB of
Prefect database per iteration in bench/longrun.py before it was bounded, with the whole run's rows)."""

ENV_COLUMNS = ("env/turns_mean", "time/env_step_s_mean", "env/failures", "env/dropped")
"""Added to TABLE_COLUMNS in an agentic run (rows with env/* keys)."""


def metrics_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's metrics, one row per iteration, the columns a person compares across iterations."""
    def cell(value: Any) -> Any:
        return round(value, 4) if isinstance(value, float) else value
    columns = TABLE_COLUMNS
    if any(row.get("env/turns_mean") is not None for row in rows):
        columns = (*TABLE_COLUMNS[:-1], *ENV_COLUMNS, TABLE_COLUMNS[-1])
    return [{column: cell(row.get(column)) for column in columns} for row in rows]


class RunArtifacts:
    """The parent flow run's artifacts: progress, the metrics table, links to the checkpoint (driver/links.py) and
    W&B.

    Keys are per run id, so the Artifacts page shows one history per run whichever flow run (first
    attempt, retry, resume) wrote it. Each is what the UI shows, not what the run needs: one the Prefect server
    does not take is skipped (`prefect_outage.tolerated`).
    """

    def __init__(self, run_id: str, iterations_planned: int) -> None:
        self.run_id = run_id
        self.key = artifact_key(run_id)
        self.iterations_planned = iterations_planned
        self.progress_id = None

    def progress(self, iterations_done: int) -> None:
        percent = 100.0 * iterations_done / max(self.iterations_planned, 1)
        description = f"run {self.run_id}: {iterations_done} of {self.iterations_planned} iterations committed"
        with tolerated("the progress artifact"):
            if self.progress_id is None:
                self.progress_id = create_progress_artifact(percent, key=f"{self.key}-progress",
                                                            description=description)
            else:
                update_progress_artifact(self.progress_id, percent, description=description)

    def metrics(self, rows: list[dict[str, Any]]) -> None:
        """`rows`: the newest (`MetricsLogger.recent`): each version of the table is stored by the server, so one
        holding every row would make its database grow with the square of the run's length."""
        with tolerated("the metrics table artifact"):
            create_table_artifact(metrics_table(rows), key=f"{self.key}-metrics",
                                  description=f"run {self.run_id}: metrics of the latest {len(rows)} iterations "
                                              "(every iteration and key: metrics.jsonl, the report)")

    def checkpoint_link(self, store, checkpoint_key: str, iteration: int, expiry_s: int) -> None:
        with tolerated("the checkpoint's link artifact"):
            publish_file_link(store, checkpoint_file(store, checkpoint_key, self.run_id, iteration),
                              f"{self.key}-checkpoint", expiry_s)

    def wandb_link(self, wandb_run: Any) -> None:
        url = getattr(wandb_run, "url", None)
        if url:
            create_link_artifact(url, link_text=f"W&B run {self.run_id}", key=f"{self.key}-wandb",
                                 description="the W&B page of the run")
            return
        folder = Path(getattr(wandb_run, "dir", ".")).resolve()
        create_markdown_artifact(markdown=f"**W&B run {self.run_id}** (offline), for `wandb sync`:\n\n"
                                          f"```\n{folder}\n```\n",
                                 key=f"{self.key}-wandb", description="the local W&B run directory (offline mode)")
