"""Predicted speedup of asynchronous training for the RollPacker paper's settings (issue 14).

The baselines are the simulator's synchronous predictions on all of the
setting's GPUs, rollout and training taking turns on them (colocated): tail
batching off (`sync_step_s`) and on (`tail_step_s`), priced as
`bench/sim_validate.py` prices them (`async_settings.py`). Async needs the GPUs
split into a rollout pool and a trainer pool; the split is the candidate that
minimises max(mean rollout round, mean train + sync) of its alpha = 0 rounds,
the step time a perfect pipeline would reach, unless one is given. The async
run is then the product's own rollout pipeline at that alpha over the rollout
pool's simulated replicas (`PolicySimulation`: its launch rule, staleness
bound and in-flight cap, its pause and resume at every weight sync), the
trainer pool's work on the virtual clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from research.async_settings import (
    AsyncSetting, rollout_cost, setting_for, simulate_run, step_cost, sync_rounds)

from tailflow.engines.sim.costs import NonRolloutCost
from tailflow.engines.sim.sim_run import SimRun
from tailflow.engines.sim.step_time import mean_step_time

TRAIN_BYTES_PER_PARAM = 16
"""bf16 weights and gradients, fp32 master weights and Adam moments, sharded over the trainer pool (ZeRO-3)."""


@dataclass(frozen=True)
class AsyncPrediction:
    preset: str
    alpha: float
    tail: bool
    """Tail batching on in the async run."""
    partial: bool
    """True: in-flight requests continue under new weights; False: they restart."""
    rollout_gpus: int
    train_gpus: int
    sync_step_s: float
    """Colocated synchronous step, tail batching off: the simulator's existing prediction."""
    tail_step_s: float
    """Colocated synchronous step, tail batching on."""
    split_sync_step_s: float
    """alpha = 0 on the async run's two pools (one idles while the other works)."""
    async_step_s: float
    speedup: float
    """sync_step_s / async_step_s."""
    speedup_vs_tail: float
    pipeline_speedup: float
    """split_sync_step_s / async_step_s: what running ahead buys on the same pools."""
    pipeline_bound: float
    """(rollout + reward + train + sync) / max(rollout, train + sync) of the split's alpha = 0 rounds: what
    overlapping rollout with training alone could buy. The pipeline can beat it: rounds also overlap each other
    on the rollout pool (a round's stragglers share decode steps with the next round's requests)."""
    rollout_utilisation: float
    trainer_utilisation: float
    staleness_histogram: dict[int, int]
    """Trained groups by staleness (training step - version of the group's oldest token)."""
    num_rounds: int
    tokens_restarted: int
    num_queued: int
    """Prompts launched and not trained at the end (the long-prompt queue)."""


def min_train_gpus(setting: AsyncSetting) -> int:
    """A memory floor only (weights, gradients, optimizer states; activations ignored)."""
    cost = rollout_cost(setting, setting.num_gpus)
    usable = cost.hardware.hbm_bytes * cost.efficiency.gpu_memory_utilization
    return math.ceil(TRAIN_BYTES_PER_PARAM * cost.model.num_params / usable)


def split_candidates(setting: AsyncSetting) -> list[int]:
    """Rollout-pool sizes: multiples of max(TP, GPUs / 8) leaving the trainer pool its memory floor."""
    unit = max(setting.tp, setting.num_gpus // 8)
    return [r for r in range(unit, setting.num_gpus, unit)
            if r % setting.tp == 0 and setting.num_gpus - r >= min_train_gpus(setting)]


@lru_cache(maxsize=64)
def choose_split(setting: AsyncSetting, tail: bool, step_cost_name: str, min_rounds: int, seed: int) -> int:
    def balance(rollout_gpus: int) -> float:
        rounds = sync_rounds(setting, rollout_gpus, tail, min_rounds, seed)
        cost = step_cost(setting, step_cost_name, setting.num_gpus - rollout_gpus, False, min_rounds, seed)
        step = mean_step_time(rounds, cost)
        return max(step.rollout_s, step.train_s + step.sync_s)

    candidates = split_candidates(setting)
    if not candidates:
        raise ValueError(f"{setting.name}: no rollout/trainer split of {setting.num_gpus} GPUs fits")
    return min(candidates, key=balance)


def simulate_async(setting: AsyncSetting, alpha: float, rollout_gpus: int, cost: NonRolloutCost, *, tail: bool = True,
                   partial: bool = True, min_rounds: int = 20, seed: int = 0) -> SimRun:
    """The product's pipeline at `alpha` on `rollout_gpus` rollout GPUs, training priced by `cost`."""
    return simulate_run(setting, rollout_gpus, tail, min_rounds, seed, alpha, partial, cost)


def predict_async(preset_name: str, alpha: float, *, tail: bool = True, partial: bool = True,
                  rollout_gpus: int | None = None, step_cost_name: str = "shares", min_rounds: int = 20,
                  seed: int = 0, prompts_per_step: int | None = None) -> AsyncPrediction:
    """Async training at `alpha` on a rollout/trainer split of the preset's GPUs, against the synchronous steps.

    `preset_name`: "7b", "14b" or "32b" (the paper's settings, `SETTINGS`). `tail`: tail batching in the async
    run (both colocated baselines are always computed). `partial`: in-flight requests continue under new
    weights (False: restart). `rollout_gpus`: the rollout pool (None: `choose_split`); the trainer gets the rest.
    `step_cost_name`: "shares" or "roofline" (module doc). `min_rounds`: rounds per simulation at least (then
    whole cycles). `prompts_per_step`: P0 (None: the paper's 128); smaller runs faster.
    """
    setting = setting_for(preset_name)
    if prompts_per_step:
        setting = replace(setting, prompts_per_step=prompts_per_step)
    if rollout_gpus is not None and not 0 < rollout_gpus < setting.num_gpus:
        raise ValueError(f"rollout_gpus must leave both pools GPUs: 0 < {rollout_gpus} < {setting.num_gpus}")
    colocated = lambda tail_on: mean_step_time(
        sync_rounds(setting, setting.num_gpus, tail_on, min_rounds, seed),
        step_cost(setting, step_cost_name, setting.num_gpus, True, min_rounds, seed)).total_s
    rollout_gpus = rollout_gpus or choose_split(setting, tail, step_cost_name, min_rounds, seed)
    cost = step_cost(setting, step_cost_name, setting.num_gpus - rollout_gpus, False, min_rounds, seed)
    split = mean_step_time(sync_rounds(setting, rollout_gpus, tail, min_rounds, seed), cost)
    run = simulate_async(setting, alpha, rollout_gpus, cost, tail=tail, partial=partial, min_rounds=min_rounds,
                         seed=seed)
    sync_s, tail_s = colocated(False), colocated(True)
    return AsyncPrediction(
        preset=setting.name, alpha=alpha, tail=tail, partial=partial, rollout_gpus=rollout_gpus,
        train_gpus=setting.num_gpus - rollout_gpus, sync_step_s=sync_s, tail_step_s=tail_s,
        split_sync_step_s=split.total_s, async_step_s=run.step_s, speedup=sync_s / run.step_s,
        speedup_vs_tail=tail_s / run.step_s, pipeline_speedup=split.total_s / run.step_s,
        pipeline_bound=split.total_s / max(split.rollout_s, split.train_s + split.sync_s),
        rollout_utilisation=run.rollout_utilisation, trainer_utilisation=run.trainer_utilisation,
        staleness_histogram=run.staleness_histogram, num_rounds=len(run.steps),
        tokens_restarted=run.tokens_restarted, num_queued=len(run.queued_problem_ids))
