"""Build a run's parts from its config: store, data, tokenizer, reward, Ray workers.

Kept out of the flows so they read as the steps they run.
"""
from __future__ import annotations

import functools
import json
import secrets
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from importlib import resources
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from tailflow.config import ConfigError, RunConfig, config_to_yaml
from tailflow.engines.cluster.placement import (
    GpuReservation,
    check_cluster_fits,
    describe_gpu_seats,
    gpu_layout,
    placement_of,
    reserve_layout,
    torch_device,
)
from tailflow.engines.cluster.membership import ElasticSettings
from tailflow.engines.cluster.reward_pool import RewardPool
from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.runtime import start_ray
from tailflow.engines.cluster.trainer_group import TrainerGroup
from tailflow.engines.cluster.worker_control import WorkerControl
from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.dataset import load_problems
from tailflow.engines.data.problem import Problem
from tailflow.engines.models import check_model_dir
from tailflow.engines.reward.spec import RewardSpec, reward_spec
from tailflow.engines.reward.timeouts import TimeoutPolicy
from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.rollout.requests import prompt_token_ids, sampling_requests
from tailflow.engines.rollout.trajectory_engine import EnvSchedule, TurnLimits
from tailflow.engines.rollout.worker import MultiTurnSetup
from tailflow.engines.round_work import RoundWorkFactory
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings
from tailflow.engines.runs.layout import config_key, metrics_key
from tailflow.engines.store import ArtifactStore, local_working_dir
from tailflow.engines.track import MetricsLogger, start_wandb
from tailflow.engines.track.tensorboard import start_tensorboard
from tailflow.flows.run_log import say

if TYPE_CHECKING:
    from tailflow.engines.cluster.env_group import EnvGroup


def shipped_warmstart_dir() -> Path:
    """The warm-start checkpoint that ships with the package (see assets/warmstart/RECIPE.md)."""
    return Path(str(resources.files("tailflow") / "assets" / "warmstart"))


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def resolve_model_path(config: RunConfig, store: ArtifactStore) -> str:
    """model.path; else the warm start of the config's recipe: cached in the store, or shipped."""
    if config.model.path:
        path = Path(config.model.path)
    else:
        path = warm_start_dir(config, store)
    check_model_dir(path)
    return str(path)


def warm_start_dir(config: RunConfig, store: ArtifactStore) -> Path:
    from tailflow.flows.warmstart import recipe_key, recipe_of

    recipe = recipe_of(config)
    if store.has_dir(recipe_key(recipe)):
        return store.local_dir(recipe_key(recipe))
    shipped = shipped_warmstart_dir()
    if json.loads((shipped / "recipe.json").read_text()) == recipe:
        return shipped
    raise ConfigError(f"no warm start for the warmstart.* settings of this config in {store.uri()}: "
                      "run `tailflow warmstart` with the same config first, or set model.path")


@dataclass(frozen=True)
class Datasets:
    train: list[Problem]
    eval: list[Problem]
    num_skipped: int


def load_datasets(config: RunConfig, tokenizer, max_prompt_tokens: int, runs_code: bool) -> Datasets:
    """`runs_code` (the reward spec's): code problems with tests (the built-in code task, or KodCode / APPS style
    files, `data.code_format`); else math-style problems with answers."""
    data = config.data
    if data.train_path is None:
        if config.env is not None:
            from tailflow.engines.data.env_task import env_splits

            train, held_out = env_splits(data.num_train, data.num_eval, data.seed)
        elif runs_code:
            from tailflow.engines.data.code_task import builtin_code_problems

            train, held_out = builtin_code_problems(data.seed)
        else:
            train, held_out = default_splits(data.num_train, data.num_eval, data.seed)
        return Datasets(train, held_out[: data.num_eval], 0)
    common = dict(id_field=data.id_field, prompt_template=data.prompt_template, tokenizer=tokenizer,
                  max_prompt_tokens=max_prompt_tokens, on_invalid=data.on_invalid)
    if runs_code:
        from tailflow.engines.data.code_task import load_code_problems

        load = functools.partial(load_code_problems, style=data.code_format, **common)
    else:
        load = functools.partial(load_problems, prompt_field=data.prompt_field, answer_field=data.answer_field,
                                 **common)
    train = load(data.train_path, source_name="data.train_path")
    held_out = load(data.eval_path, source_name="data.eval_path")
    return Datasets(train.problems, held_out.problems[: data.num_eval], train.num_skipped + held_out.num_skipped)


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
    start_ray(config.cluster.address, config.cluster.num_cpus, config.train.num_workers + config.rollout.num_workers,
              config.cluster.num_gpus)
    check_cluster_fits(config)
    tracking = config.tracking
    wandb_run = (start_wandb(run_id, tracking.wandb_project, tracking.wandb_mode, config.model_dump(mode="json"),
                             str(local_working_dir(store, run_id))) if tracking.wandb else None)
    tensorboard = start_tensorboard(tracking.tensorboard, local_working_dir(store, run_id))
    metrics = MetricsLogger(store, run_id, wandb_run, tensorboard)
    elastic = elastic_settings(config, store, run_id, workers_added)
    # The workers last: nothing after them can fail and leak them.
    rollout, trainer, reward_pool = start_workers(config, inputs.model_path, inputs.max_seq_len, elastic)
    ctx = RunContext(
        run_id=run_id, config=config, store=store, tokenizer=inputs.tokenizer, train_problems=inputs.datasets.train,
        eval_problems=inputs.datasets.eval, reward=inputs.reward, timeouts=TimeoutPolicy.from_config(config.reward),
        sampling=sampling_params(config), tail=TailSettings.from_config(config), rollout=rollout, trainer=trainer,
        reward_pool=reward_pool, metrics=metrics, model_path=inputs.model_path, model_config=inputs.model_config,
        max_seq_len=inputs.max_seq_len, num_skipped_rows=inputs.datasets.num_skipped, watch=watch,
    )
    return with_pipeline(ctx)


def say_gpu_seats(trainer_workers: list, rollout_workers: list) -> None:
    """Where Ray put each actor (a seat it cannot place fails before this, in `reserve`)."""
    for line in describe_gpu_seats(trainer_workers, rollout_workers):
        print(f"[tailflow] {line}", file=sys.stderr, flush=True)


def with_pipeline(ctx: RunContext) -> RunContext:
    """The context with its rounds' observers and the rollout pipeline built over its current workers: every
    round's requests seeded by the run seed, the iteration and the request (`sampling_requests`), whatever
    the mode."""
    config = ctx.config

    def make_requests(planned: PlannedRound) -> list[Request]:
        return sampling_requests(planned.problems, planned.plan.responses_per_prompt, ctx.sampling, ctx.tokenizer,
                                 config.train.seed, planned.plan.iteration, config.data.prompt_template)

    round_work = RoundWorkFactory(config, ctx.reward_pool, ctx.trainer, ctx.tokenizer, ctx.reward.runs_code,
                                  ctx.watch)
    pipeline = RolloutPipeline(ctx.rollout, ctx.tail, config.rollout.async_ratio, config.rollout.partial,
                               ctx.train_problems, make_requests, round_work)
    return ctx.replacing(round_work=round_work, pipeline=pipeline)


@dataclass(frozen=True)
class ModelInputs:
    """What a run, its preflight check and `tailflow eval` read before any actor starts."""
    model_path: str
    model_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    reward: RewardSpec
    datasets: Datasets
    """Prompts that fit the model's context with room for a response."""
    max_seq_len: int
    """The engines' sequence capacity: the longest prompt plus rollout.max_new_tokens (with `env`: the model's
    context, which a trajectory may fill)."""


def load_inputs(config: RunConfig, store: ArtifactStore) -> ModelInputs:
    """The model (`resolve_model_path`), its tokenizer, the reward spec and the datasets."""
    model_path = resolve_model_path(config, store)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    reward = reward_spec(config.reward, model_path)
    model_config = AutoConfig.from_pretrained(model_path)
    context_length = int(model_config.max_position_embeddings)
    max_prompt_tokens = context_length - config.rollout.max_new_tokens
    if max_prompt_tokens < 1:
        raise ConfigError(f"rollout.max_new_tokens ({config.rollout.max_new_tokens}) leaves no room for a prompt "
                          f"in the model's context of {context_length} tokens")
    datasets = load_datasets(config, tokenizer, max_prompt_tokens, reward.runs_code)
    longest_prompt = max(len(prompt_token_ids(p, tokenizer, config.data.prompt_template))
                         for p in datasets.train + datasets.eval)
    if config.env is not None:  # a trajectory may fill the context: observations' lengths are the environment's
        return ModelInputs(model_path, model_config, tokenizer, reward, datasets, context_length)
    return ModelInputs(model_path, model_config, tokenizer, reward, datasets,
                       longest_prompt + config.rollout.max_new_tokens)


def sampling_params(config: RunConfig) -> SamplingParams:
    """Training rollouts' sampling (each request's seed is derived per request)."""
    rollout = config.rollout
    return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                          max_new_tokens=rollout.max_new_tokens)


def reserve_gpus(config: RunConfig, with_trainer: bool = True) -> GpuReservation | None:
    """On GPUs, the run's placement groups (waited for; refused with the numbers when Ray cannot place them);
    None on CPUs. Without the trainer (`tailflow evaluate`) only the rollout workers' bundles."""
    if config.cluster.device != "gpu":
        return None
    cluster = config.cluster
    return reserve_layout(gpu_layout(cluster.placement, config.rollout.num_workers,
                                     config.train.num_workers if with_trainer else 0, cluster.spread_trainer_ranks))


def start_rollout_and_reward(config: RunConfig, model_path: str, max_seq_len: int, with_trainer: bool = False,
                             elastic: ElasticSettings = ElasticSettings()
                             ) -> tuple[RolloutGroup, RewardPool, GpuReservation | None]:
    """The actors that generate and score: enough for evaluation, and the first part of a run's workers. On
    GPUs the run's placement groups are reserved first (`with_trainer`: the trainer ranks' bundles too, for
    `start_workers` to seat them) and held by the rollout group; released here if the actors cannot start.
    `elastic`: how the rollout group's members may change (a run's: `elastic_settings`)."""
    reservation = reserve_gpus(config, with_trainer)
    reward = config.reward
    try:
        pool = RewardPool(reward_spec(reward, model_path), reward.min_workers, reward.max_workers,
                          reward.backlog_per_worker)
        try:
            env_group, multi_turn = start_environments(config, max_seq_len)
            rollout = RolloutGroup(
                model_path, config.rollout.num_workers, config.rollout.num_slots, max_seq_len, config.train.seed,
                config.cluster.rollout_threads, **rollout_resources(config), engine=config.rollout.engine,
                device=torch_device(config.cluster.device),
                sleep_mode=config.cluster.placement == "colocated" and config.cluster.device == "gpu",
                actor_options=reservation.rollout_options() if reservation else None, reservation=reservation,
                elastic=elastic, multi_turn=multi_turn)
            rollout.env_group = env_group
        except BaseException:
            pool.shutdown()  # a leaked actor keeps its CPUs: a retried flow could never place its new ones
            raise
    except BaseException:
        if reservation is not None:
            reservation.drop()
        raise
    return rollout, pool, reservation


def start_environments(config: RunConfig, max_seq_len: int) -> tuple[EnvGroup | None, MultiTurnSetup | None]:
    """With `env` set: the environment workers, and what makes each rollout worker's requests trajectories on
    them (`max_seq_len`, the engines' capacity, is the trajectories' context length). None, None without."""
    env = config.env
    if env is None:
        return None, None
    from tailflow.engines.cluster.env_connector import RemoteEnvironments
    from tailflow.engines.cluster.env_group import EnvGroup

    group = EnvGroup(env)
    limits = TurnLimits(env.max_turns, env.turn_max_tokens, env.trajectory_max_tokens, max_seq_len,
                        env.invalid_action_reward)
    schedule = EnvSchedule(env.schedule)
    environments = RemoteEnvironments(group.workers, wait_on_close=schedule is not EnvSchedule.ASYNC)
    return group, MultiTurnSetup(limits, environments, tuple(env.turn_stop_texts), schedule)


def rollout_resources(config: RunConfig) -> dict[str, float]:
    """What a rollout worker asks Ray for outside any placement group: every worker on CPUs; on GPUs only the
    workers added at runtime (`tailflow workers add`), which get a whole GPU of their own (no trainer rank
    shares it)."""
    if config.cluster.device == "gpu":
        return {"num_cpus": 1, "num_gpus": 1}
    placement = placement_of(config)
    return {"num_cpus": placement.rollout.num_cpus, "num_gpus": placement.rollout.num_gpus}


def start_workers(config: RunConfig, model_path: str, max_seq_len: int,
                  elastic: ElasticSettings = ElasticSettings()) -> tuple[RolloutGroup, TrainerGroup, RewardPool]:
    """The run's Ray actors: rollout and trainer holding `model_path`'s weights, and the reward pool. On GPUs
    both groups sit in one reservation and hold it; the last to shut down releases it."""
    rollout, pool, reservation = start_rollout_and_reward(config, model_path, max_seq_len, True, elastic)
    placement = placement_of(config)
    try:
        trainer = TrainerGroup(model_path, config.train.num_workers, trainer_kwargs(config),
                               num_cpus_per_worker=placement.trainer.num_cpus,
                               num_gpus_per_worker=placement.trainer.num_gpus,
                               num_threads=config.cluster.threads_per_worker,
                               actor_options=reservation.trainer_options() if reservation else None,
                               reservation=reservation)
        try:
            pool.check_started()  # the reward actors booted alongside; a judge that cannot load fails here, named
            if reservation is not None:
                say_gpu_seats(trainer.workers, rollout.membership.workers)
        except BaseException:
            trainer.shutdown()
            raise
    except BaseException:
        rollout.shutdown()
        pool.shutdown()
        raise
    return rollout, trainer, pool


def restart_workers(ctx: RunContext) -> RunContext:
    """Every actor replaced (after one died): fresh processes holding the initial weights, in a new context;
    the caller restores a commit into them. The rollout workers added at runtime are kept."""
    elastic = elastic_settings(ctx.config, ctx.store, ctx.run_id, ctx.rollout.workers_added())
    for group in (ctx.rollout, ctx.trainer, ctx.reward_pool):
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001 - an actor already gone is what we are recovering from
            pass
    rollout, trainer, reward_pool = start_workers(ctx.config, ctx.model_path, ctx.max_seq_len, elastic)
    return with_pipeline(ctx.replacing(rollout=rollout, trainer=trainer, reward_pool=reward_pool))


def elastic_settings(config: RunConfig, store: ArtifactStore, run_id: str, workers_added: int) -> ElasticSettings:
    """A run's rollout group follows `rollout.elastic`, reads `tailflow workers add/remove` commands from the
    run's store between polls, and says what changes in the run's log. `workers_added`: workers added at runtime
    (minus those removed) before a resume or an iteration restart, started again (elastic runs only)."""
    if not config.rollout.elastic:
        return ElasticSettings(is_elastic=False, say=say)
    if workers_added:
        say(f"[tailflow] keeping the rollout workers added at runtime: {config.rollout.num_workers} "
            f"(rollout.num_workers) {workers_added:+d}")
    control = WorkerControl(store, run_id, config.cluster.worker_control_interval_s)
    return ElasticSettings(is_elastic=True, control=control, say=say, keep_added=workers_added)


def trainer_kwargs(config: RunConfig) -> dict:
    """`max_new_tokens`: the longest response a sample can have (Dr. GRPO's constant divisor): a trajectory's
    tokens after the prompt are bounded by env.trajectory_max_tokens, not by rollout.max_new_tokens."""
    longest = config.env.trajectory_max_tokens if config.env is not None else config.rollout.max_new_tokens
    return dict(
        train=config.train, max_new_tokens=longest, temperature=config.rollout.temperature,
        backend="nccl" if torch_device(config.cluster.device) == "cuda" else "gloo",
    )


def shutdown_workers(ctx: RunContext) -> None:
    """Stop the context's actors (idempotent: a group already shut down has none left)."""
    ctx.rollout.shutdown()
    ctx.trainer.shutdown()
    ctx.reward_pool.shutdown()
