"""The parent flow of a run: set up, evaluate, iterate, evaluate, summarise."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow

from tailflow.config import RunConfig, config_from_dict, load_config
from tailflow.engines.run_state import RunState
from tailflow.flows.iteration import iteration
from tailflow.flows.setup import build_context, new_run_id, prepare_run_dir, shutdown_context
from tailflow.tasks.evaluate import evaluate


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


@flow(name="rl_training", flow_run_name="{run_id}")
def rl_training(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    config: dict[str, Any] | None = None,
) -> RunSummary:
    """Train a policy with RL; the config comes from a YAML file plus overrides, or a dict."""
    run_config = resolve_config(config_path, overrides or [], config)
    run_id = run_id or new_run_id()
    store = prepare_run_dir(run_config, run_id)
    ctx = build_context(run_config, run_id, store)
    try:
        state = RunState(run_id=run_id, initial_eval_accuracy=evaluate(ctx))
        print_start(ctx, state)
        for step in range(run_config.train.iterations):
            state = iteration(ctx, state, step)
            print_progress(ctx.metrics.rows()[-1])
        return summarize(ctx, state)
    finally:
        shutdown_context(ctx)


def resolve_config(config_path: str | None, overrides: list[str], config: dict[str, Any] | None) -> RunConfig:
    if config is not None:
        return config_from_dict(config)
    return load_config(config_path, overrides)


def summarize(ctx, state: RunState) -> RunSummary:
    rows = ctx.metrics.rows()
    return RunSummary(
        run_id=ctx.run_id,
        run_dir=ctx.store.uri(ctx.run_id),
        iterations=state.iteration,
        initial_accuracy=state.initial_eval_accuracy,
        final_accuracy=state.last_eval_accuracy,
        mean_step_seconds=sum(r["time/step_total"] for r in rows) / max(len(rows), 1),
        latest_checkpoint=ctx.store.uri(state.latest_checkpoint) if state.latest_checkpoint else None,
        metrics_path=ctx.store.uri(ctx.metrics.key),
    )


def print_start(ctx, state: RunState) -> None:
    skipped = f" ({ctx.num_skipped_rows} invalid rows skipped)" if ctx.num_skipped_rows else ""
    print(f"[tailflow] run {ctx.run_id}: {len(ctx.train_problems)} train / {len(ctx.eval_problems)} eval problems"
          f"{skipped}, initial greedy accuracy {state.initial_eval_accuracy:.1%}", flush=True)


def print_progress(row: dict[str, Any]) -> None:
    evaluated = f" | eval {row['eval/accuracy']:.1%}" if row.get("eval/accuracy") is not None else ""
    print(
        f"[tailflow] iter {row['iteration']:04d} | step {row['time/step_total']:.1f}s "
        f"(gen {row['time/step_generate']:.1f}s, train {row['time/step_train']:.1f}s) | "
        f"reward {row['reward/mean']:.3f} | len mean {row['token/response_length/mean']:.0f} "
        f"max {row['token/response_length/max']}{evaluated}",
        flush=True,
    )
