"""The policy's optimizer step on the scored groups: after scoring, streamed during rollout (train.stream), or
while the next rounds roll out (asynchronous)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tailflow.engines.cluster.placement import takes_turns
from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.round_work import RoundWork
from tailflow.engines.run_context import RunContext
from tailflow.engines.tail.taken import OverlapStats
from tailflow.engines.train.samples import samples_from_groups
from tailflow.engines.train.trainer import TrainStepStats
from tailflow.tasks.cancellable import run_task

if TYPE_CHECKING:
    from tailflow.engines.cluster.trainer_group import PendingTrainStep


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
    if observer.stream is not None:
        return TrainedStep(observer.stream.finish(scored), OverlapStats())
    bound = ctx.config.tail.trained_token_age_bound(ctx.pipeline.max_staleness)
    pending = start_step(ctx, scored, weight_version, max_staleness=bound)
    overlap = ctx.pipeline.roll_while(pending.ready, ctx.config.rollout.async_steps_per_train)
    return TrainedStep(pending.result(), overlap)


def start_step(ctx: RunContext, scored: ScoredRound, weight_version: int,
               max_staleness: int | None = 0) -> PendingTrainStep:
    """The step on `scored`'s groups as `train.*` configures it, issued on the ranks without waiting."""
    train = ctx.config.train
    samples = samples_from_groups(scored.groups, train.advantage, weight_version=weight_version,
                                  max_staleness=max_staleness, rollout_temperature=ctx.sampling.temperature)
    if takes_turns(ctx.config):  # colocated on GPUs: the engines free the GPU memory the trainer is about to use
        ctx.rollout.sleep()
    return ctx.trainer.start_train_step(samples, skip_zero_advantage=train.skips_zero_advantage,
                                        ppo_epochs=train.ppo_epochs, mini_batches=train.mini_batches, seed=train.seed)
