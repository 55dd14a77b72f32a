"""Starting and stopping a run's Ray actors: the GPU reservation, the rollout group, the reward pool, the
environment workers and the trainer group, with the settings each is started with.

One place that owns the actors' lifetimes, so a failure while starting them shuts down what had started.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NamedTuple

from tailflow.config import RunConfig
from tailflow.driver.run_log import say
from tailflow.engines.cluster.placement import (
    GpuReservation,
    describe_gpu_seats,
    gpu_layout,
    placement_of,
    reserve_layout,
    torch_device,
)
from tailflow.engines.cluster.membership import ElasticSettings
from tailflow.engines.cluster.reward_pool import RewardPool
from tailflow.engines.cluster.rollout_group import RolloutGroup
from tailflow.engines.cluster.trainer_group import TrainerGroup
from tailflow.engines.cluster.worker_control import WorkerControl
from tailflow.engines.reward.spec import reward_spec
from tailflow.engines.rollout.trajectory_engine import EnvSchedule, TurnLimits
from tailflow.engines.rollout.worker import MultiTurnSetup
from tailflow.engines.run_context import RunContext
from tailflow.engines.store import ArtifactStore

if TYPE_CHECKING:
    from tailflow.engines.cluster.env_group import EnvGroup
    from tailflow.engines.train.worker import TrainerRole


def say_gpu_seats(trainer_workers: list, rollout_workers: list) -> None:
    """Where Ray put each actor (a seat it cannot place fails before this, in `reserve`)."""
    for line in describe_gpu_seats(trainer_workers, rollout_workers):
        print(f"[tailflow] {line}", file=sys.stderr, flush=True)


def reserve_gpus(config: RunConfig, with_trainer: bool = True) -> GpuReservation | None:
    """On GPUs, the run's placement groups (waited for; refused with the numbers when Ray cannot place them);
    None on CPUs. Without the trainer (`tailflow evaluate`) only the rollout workers' bundles."""
    if config.cluster.device != "gpu":
        return None
    cluster = config.cluster
    return reserve_layout(gpu_layout(cluster.placement, config.rollout.num_workers,
                                     config.train.num_workers if with_trainer else 0, cluster.spread_trainer_ranks,
                                     with_critic=with_trainer and config.train.has_critic))


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


class RunWorkers(NamedTuple):
    rollout: RolloutGroup
    trainer: TrainerGroup
    critic: TrainerGroup | None
    """train.advantage gae's value model (None: no critic)."""
    reward_pool: RewardPool


def start_workers(config: RunConfig, model_path: str, max_seq_len: int,
                  elastic: ElasticSettings = ElasticSettings()) -> RunWorkers:
    """The run's Ray actors: rollout and trainer holding `model_path`'s weights, the critic (train.advantage gae)
    built from them, and the reward pool. On GPUs the rollout, trainer and critic groups sit in one reservation
    (a critic rank beside its trainer rank) and hold it; the last to shut down releases it."""
    rollout, pool, reservation = start_rollout_and_reward(config, model_path, max_seq_len, True, elastic)
    started: list = []
    try:
        trainer = start_trainer_group(config, model_path, reservation=reservation)
        started.append(trainer)
        critic = (start_trainer_group(config, model_path, role="critic", reservation=reservation)
                  if config.train.has_critic else None)
        if critic is not None:
            started.append(critic)
        pool.check_started()  # the reward actors booted alongside; a judge that cannot load fails here, named
        if reservation is not None:
            say_gpu_seats(trainer.workers, rollout.membership.workers)
    except BaseException:
        for group in (*started, rollout, pool):
            group.shutdown()
        raise
    return RunWorkers(rollout, trainer, critic, pool)


def start_trainer_group(config: RunConfig, model_path: str, role: TrainerRole = "policy",
                        reservation: GpuReservation | None = None) -> TrainerGroup:
    """train.num_workers ranks holding `model_path`'s weights (role critic: train.advantage gae's value model built
    from them), each with the placement's per-rank resources, or seated in `reservation` (on GPUs: the role's
    seats)."""
    placement = placement_of(config)
    return TrainerGroup(model_path, config.train.num_workers, trainer_kwargs(config),
                        num_cpus_per_worker=placement.trainer.num_cpus,
                        num_gpus_per_worker=placement.trainer.num_gpus,
                        num_threads=config.cluster.threads_per_worker,
                        actor_options=(None if reservation is None else
                                       reservation.critic_options() if role == "critic" else
                                       reservation.trainer_options()),
                        reservation=reservation, role=role)


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
    return dict(
        train=config.train, max_new_tokens=config.longest_response_tokens, temperature=config.rollout.temperature,
        backend="nccl" if torch_device(config.cluster.device) == "cuda" else "gloo",
    )


def shutdown_workers(ctx: RunContext) -> None:
    """Stop the context's actors (idempotent: a group already shut down has none left)."""
    ctx.rollout.shutdown()
    ctx.trainer.shutdown()
    if ctx.critic is not None:
        ctx.critic.shutdown()
    ctx.reward_pool.shutdown()
