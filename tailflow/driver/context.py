"""A run's id, its directory in the store and its `RunContext`: the inputs, Ray, tracking and the workers put
together, and put together again over fresh workers after an actor died.

Built from `inputs` and `workers`, so the training flow starts or restarts a run in one call.
"""
from __future__ import annotations

import secrets
import time

from tailflow.config import ConfigError, RunConfig, config_to_yaml
from tailflow.driver.inputs import load_inputs, sampling_params
from tailflow.driver.workers import elastic_settings, start_workers
from tailflow.engines.cluster.placement import check_cluster_fits
from tailflow.engines.cluster.runtime import start_ray
from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy
from tailflow.engines.rollout.protocol import Request
from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.round_work import RoundWorkFactory
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings
from tailflow.engines.runs.layout import config_key, metrics_key
from tailflow.engines.store import ArtifactStore, local_working_dir
from tailflow.engines.track import MetricsLogger, start_wandb
from tailflow.engines.track.tensorboard import start_tensorboard


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def prepare_run_dir(store: ArtifactStore, config: RunConfig, run_id: str) -> None:
    """Start `<run_id>/` in the store with the resolved config (the run has no commit: anything there is
    from an attempt that crashed before committing and is replaced)."""
    if store.exists(f"{run_id}/state.json"):
        raise ConfigError(f"run {run_id} in {store.uri()} was written by a tailflow without resumable commits; "
                          "choose another --run-id")
    store.write_text(config_key(run_id), config_to_yaml(config))
    if store.exists(metrics_key(run_id)):
        store.write_text(metrics_key(run_id), "")


def build_context(config: RunConfig, run_id: str, store: ArtifactStore, watch, workers_added: int) -> RunContext:
    """Everything the run holds; `watch` (live progress) gives a watcher for each round's finished responses;
    `workers_added`: the rollout workers a resumed run added at runtime (its commit's `rollout_workers_added`)."""
    inputs = load_inputs(config, store)
    start_ray(config.cluster.address, config.cluster.num_cpus, config.train.num_ranks + config.rollout.num_workers,
              config.cluster.num_gpus)
    check_cluster_fits(config)
    tracking = config.tracking
    wandb_run = (start_wandb(run_id, tracking.wandb_project, tracking.wandb_mode, config.model_dump(mode="json"),
                             str(local_working_dir(store, run_id))) if tracking.wandb else None)
    tensorboard = start_tensorboard(tracking.tensorboard, local_working_dir(store, run_id))
    metrics = MetricsLogger(store, run_id, wandb_run, tensorboard)
    elastic = elastic_settings(config, store, run_id, workers_added)
    # The workers last: nothing after them can fail and leak them.
    rollout, trainer, critic, reward_pool = start_workers(config, inputs.model_path, inputs.max_seq_len, elastic)
    ctx = RunContext(
        run_id=run_id, config=config, store=store, tokenizer=inputs.tokenizer, train_problems=inputs.datasets.train,
        eval_problems=inputs.datasets.eval, reward=inputs.reward, timeouts=TimeoutPolicy.from_config(config.reward),
        sampling=sampling_params(config), tail=TailSettings.from_config(config), rollout=rollout, trainer=trainer,
        critic=critic, reward_pool=reward_pool, metrics=metrics, model_path=inputs.model_path,
        model_config=inputs.model_config,
        max_seq_len=inputs.max_seq_len, num_skipped_rows=inputs.datasets.num_skipped, watch=watch,
    )
    return with_pipeline(ctx)


def with_pipeline(ctx: RunContext) -> RunContext:
    """The context with its rounds' observers and the rollout pipeline built over its current workers: every
    round's requests seeded by the run seed, the iteration and the request (`sampling_requests`), whatever
    the mode."""
    config = ctx.config

    def make_requests(planned: PlannedRound) -> list[Request]:
        return sampling_requests(planned.problems, planned.plan.responses_per_prompt, ctx.sampling, ctx.tokenizer,
                                 config.train.seed, planned.plan.iteration, config.data.prompt_template)

    round_work = RoundWorkFactory(config, ctx.reward_pool, ctx.trainer, ctx.tokenizer,
                                  ctx.timeouts if ctx.reward.runs_code else None, ctx.watch)
    # take_round hands the pipeline the hook of the last commit's anchors before any round is launched
    pipeline = RolloutPipeline(ctx.rollout, ctx.tail, config.rollout.async_ratio, config.rollout.partial,
                               ctx.train_problems, make_requests, round_work.launching_from(TimeoutAnchors()))
    return ctx.replacing(round_work=round_work, pipeline=pipeline)


def restart_workers(ctx: RunContext) -> RunContext:
    """Every actor replaced (after one died): fresh processes holding the initial weights, in a new context;
    the caller restores a commit into them. The rollout workers added at runtime are kept."""
    elastic = elastic_settings(ctx.config, ctx.store, ctx.run_id, ctx.rollout.workers_added())
    for group in (ctx.rollout, ctx.trainer, ctx.critic, ctx.reward_pool):
        try:
            if group is not None:
                group.shutdown()
        except Exception:  # noqa: BLE001 - an actor already gone is what we are recovering from
            pass
    rollout, trainer, critic, reward_pool = start_workers(ctx.config, ctx.model_path, ctx.max_seq_len, elastic)
    return with_pipeline(ctx.replacing(rollout=rollout, trainer=trainer, critic=critic, reward_pool=reward_pool))
