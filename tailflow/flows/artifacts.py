"""Prefect artifacts: what a person browsing the UI sees of each iteration."""
from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact

from tailflow.engines.run_state import RunState

SHOWN = (
    "time/step_total", "time/step_generate", "time/step_reward", "time/step_train", "time/step_model_update",
    "reward/mean", "reward/accuracy", "token/response_length/mean", "token/response_length/max",
    "rollout/bubble_ratio", "tail/round", "tail/long_queue_size", "tail/aborted_requests", "tail/wasted_tokens", "actor/pg_loss", "actor/grad_norm",
    "eval/accuracy",
)


def iteration_markdown(row: dict[str, Any], state: RunState) -> str:
    lines = [f"# {state.run_id} · iteration {row['iteration']}", "", "| metric | value |", "| --- | --- |"]
    for name in SHOWN:
        if row.get(name) is not None:
            value = row[name]
            lines.append(f"| `{name}` | {value:.4g} |" if isinstance(value, float) else f"| `{name}` | {value} |")
    lines += ["", f"Long-prompt queue: {len(state.long_queue)} prompts"]
    if state.long_queue:
        lines += ["", "| oldest queued | times deferred | first deferred at |", "| --- | --- | --- |"]
        lines += [f"| `{entry['problem_id']}` | {entry['times_deferred']} | {entry['first_deferred_iteration']} |"
                  for entry in state.long_queue[:5]]
    lines += ["", f"Latest checkpoint: `{state.latest_checkpoint or 'none yet'}`"]
    return "\n".join(lines)


def publish_iteration_summary(row: dict[str, Any], state: RunState) -> None:
    create_markdown_artifact(
        key=f"{artifact_key(state.run_id)}-iteration",
        markdown=iteration_markdown(row, state),
        description=f"iteration {row['iteration']} of run {state.run_id}",
    )


def artifact_key(run_id: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in run_id.lower())
    return cleaned.strip("-") or "run"
