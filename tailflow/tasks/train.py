"""The policy's optimizer step on the scored groups: after scoring, streamed during rollout (train.stream), or
while the next rounds roll out (asynchronous)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tailflow.engines.cluster.placement import takes_turns
from tailflow.config import RunConfig
from tailflow.engines.reward.scoring import ScoredGroup, ScoredRound
from tailflow.engines.round_work import RoundWork
from tailflow.engines.run_context import RunContext
from tailflow.engines.runs.round_dump import RoundDump, write_round_dump
from tailflow.engines.tail.taken import OverlapStats
from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.samples import gae_samples, samples_from_groups
from tailflow.engines.train.trainer import TrainStepStats
from tailflow.tasks.cancellable import run_task

if TYPE_CHECKING:
    from tailflow.engines.cluster.trainer_group import PendingTrainStep, TrainerGroup


@dataclass(frozen=True)
class TrainedStep:
    stats: TrainStepStats
    overlap: OverlapStats
    """What the rollout did during the step (nothing when synchronous)."""


@run_task
def train_policy(ctx: RunContext, scored: ScoredRound, observer: RoundWork, iteration: int,
                 weight_version: int) -> TrainedStep:
    """One step on the round's groups. `weight_version`: the weights the trainer holds (the responses may be at
    most the pipeline's `max_staleness` versions older; with tail.continue_deferred no bound: a continued response
    is as old as its prompt's wait in the queue). Streamed (`observer.stream`): the groups sent during rollout
    are trained already, only the rest is sent. Asynchronous: the rollout runs on meanwhile, as long as the
    step takes or exactly `rollout.async_steps_per_train` engine steps (the deterministic mode)."""
    ctx.fault_point("train", iteration)
    bound = ctx.config.tail.trained_token_age_bound(0 if observer.stream is not None else ctx.pipeline.max_staleness)
    if ctx.config.storage.dump_rounds:
        write_round_dump(ctx.store, ctx.run_id, RoundDump(iteration, weight_version, bound,
                                                          ctx.config.longest_response_tokens, scored.groups))
    if observer.stream is not None:
        return TrainedStep(observer.stream.finish(scored), OverlapStats())
    pending = start_step(ctx, scored, weight_version, max_staleness=bound)
    overlap = ctx.pipeline.roll_while(pending.ready, ctx.config.rollout.async_steps_per_train)
    return TrainedStep(pending.result(), overlap)


def start_step(ctx: RunContext, scored: ScoredRound, weight_version: int,
               max_staleness: int | None = 0) -> PendingTrainStep:
    """The step on `scored`'s groups as `train.*` configures it, issued on the ranks without waiting. The samples
    first: a round the trainer must refuse (`check_weight_version`) is refused with the engines still serving."""
    samples = step_samples(ctx.config, scored.groups, weight_version, max_staleness, ctx.critic)
    if takes_turns(ctx.config):  # colocated on GPUs: the engines free the GPU memory the trainer is about to use
        ctx.rollout.sleep()
    return start_policy_step(ctx.trainer, ctx.config, samples, ctx.critic)


def step_samples(config: RunConfig, groups: list[ScoredGroup], weight_version: int, max_staleness: int | None,
                 critic: TrainerGroup | None = None) -> list[TrainSample]:
    """The step's samples as train.advantage says: group-relative advantages, or (gae) the `critic`'s values of
    every trained response, GAE over them (its weights as they are now, after the last iteration's critic step,
    whatever weights sampled the tokens). Also `tailflow replay`'s, on a dumped round (driver/replay.py)."""
    train = config.train
    if train.has_critic:
        per_turn = config.env is None or config.env.reward != "verifier"
        return gae_samples(groups, critic.values, train.critic, weight_version=weight_version,
                           max_staleness=max_staleness, rollout_temperature=config.rollout.temperature,
                           per_turn=per_turn)
    return samples_from_groups(groups, train.advantage, weight_version=weight_version, max_staleness=max_staleness,
                               rollout_temperature=config.rollout.temperature)


def start_policy_step(trainer: TrainerGroup, config: RunConfig, samples: list[TrainSample],
                      critic: TrainerGroup | None = None) -> PendingTrainStep:
    """`trainer`'s step on `samples`, and the `critic`'s beside it on its own ranks (train.advantage gae), issued
    without waiting; the pending step waits for both."""
    train = config.train
    value_step = (critic.start_value_step(samples, train.ppo_epochs, train.mini_batches, train.seed)
                  if critic is not None else None)
    return trainer.start_train_step(samples, skip_zero_advantage=train.skips_zero_advantage,
                                    ppo_epochs=train.ppo_epochs, mini_batches=train.mini_batches, seed=train.seed,
                                    value_step=value_step)
