"""Predicted speedup of asynchronous training for the RollPacker paper's settings (issue 14).

The baselines are the simulator's existing synchronous predictions on all of
the setting's GPUs, rollout and training taking turns on them (colocated):
tail batching off (`sync_step_s`) and on (`tail_step_s`), priced as
`bench/sim_paper.py` prices them. Async needs the GPUs split into a rollout
pool and a trainer pool; the split is the candidate that minimises
max(mean rollout round, mean train + sync) of its alpha = 0 rounds, the
step time a perfect pipeline would reach, unless one is given. The async run
(`async_pipeline.py`) then runs on that split at the given alpha.

Step costs (`step_cost`):
* `shares` (default, as `bench/sim_validate.py`): reward and train time fixed
  on the colocated synchronous rounds by the paper's Table 1 shares (72%
  rollout, 5% reward, 23% train); train time scales as all GPUs / trainer
  GPUs; weight sync 0 when colocated (inside Table 1's train share, as the
  existing prediction) and one copy of the weights over the network between
  disaggregated pools (the roofline's `weight_sync_s`);
* `roofline`: the roofline's train time on the trainer pool's GPUs, no
  reward, the roofline's weight sync in every case.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from tailflow.engines.sim.async_engine import AsyncSimEngine
from tailflow.engines.sim.async_pipeline import AsyncPipeline, AsyncRun
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySettings, PolicySimulation, SimRound, simulate_policy
from tailflow.engines.sim.step_time import LinearStepCost, NonRolloutCost, mean_step_time, shares_from_baseline

NUM_SLOTS = 2048
"""vLLM's max_num_seqs in RollPacker's example config (as bench/sim_paper.py)."""
NUM_PROMPTS = 20_000
TRAIN_BYTES_PER_PARAM = 16
"""bf16 weights and gradients, fp32 master weights and Adam moments, sharded over the trainer pool (ZeRO-3)."""


@dataclass(frozen=True)
class AsyncSetting:
    """One of the paper's settings (bench/sim_paper.py's PAPER; its bench checks the two agree)."""

    name: str
    model: str
    num_gpus: int
    tp: int
    max_new_tokens: int
    hardware: str = "h800"
    prompts_per_step: int = 128
    responses_kept: int = 8
    prompt_ratio: float = 1.25
    responses_launched: int = 10


SETTINGS = {
    "7b": AsyncSetting("7B/8k", "qwen2.5-7b", 16, 1, 8192),
    "14b": AsyncSetting("14B/16k", "qwen2.5-14b", 32, 2, 16384),
    "32b": AsyncSetting("32B/32k", "qwen2.5-32b", 64, 2, 32768),
}


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
    """split_sync_step_s / async_step_s: what overlapping alone buys on the same pools."""
    pipeline_bound: float
    """(rollout + reward + train + sync) / max(rollout, train + sync) of the split's alpha = 0 rounds."""
    rollout_utilisation: float
    trainer_utilisation: float
    staleness_histogram: dict[int, int]
    """Trained groups by staleness (training step - version of the group's oldest token)."""
    num_rounds: int
    tokens_restarted: int
    num_requeued: int


def setting_for(preset_name: str) -> AsyncSetting:
    try:
        return SETTINGS[preset_name.lower()]
    except KeyError:
        raise ValueError(f"unknown async preset {preset_name!r}; known: {', '.join(SETTINGS)}") from None


def policy(setting: AsyncSetting, tail: bool, seed: int) -> PolicySettings:
    if not tail:
        return PolicySettings(setting.prompts_per_step, setting.responses_kept, 1.0, None, enabled=False,
                              data_seed=seed)
    return PolicySettings(setting.prompts_per_step, setting.responses_kept, setting.prompt_ratio,
                          setting.responses_launched, data_seed=seed)


def rollout_cost(setting: AsyncSetting, num_gpus: int) -> RooflineCost:
    return RooflineCost.from_presets(setting.hardware, setting.model, num_gpus, setting.tp)


def lengths_of(setting: AsyncSetting, seed: int) -> PaperLikeLengths:
    return paper_lengths(setting.max_new_tokens, seed)


@lru_cache(maxsize=8)
def paper_lengths(max_new_tokens: int, seed: int) -> PaperLikeLengths:
    """Shared by the simulations of one cap and seed (building 20,000 prompts' difficulties takes a second); safe
    because simulations run one after another and each round sets the source's round before drawing."""
    return PaperLikeLengths(NUM_PROMPTS, max_new_tokens, seed)


@lru_cache(maxsize=64)
def sync_rounds(setting: AsyncSetting, num_gpus: int, tail: bool, min_rounds: int, seed: int) -> tuple[SimRound, ...]:
    """The existing synchronous simulation (as bench/sim_paper.py's simulate_cell) on `num_gpus` rollout GPUs."""
    cost, lengths = rollout_cost(setting, num_gpus), lengths_of(setting, seed)
    group = lambda: SimGroup.of(cost, lengths, cost.cluster.num_replicas, NUM_SLOTS, cost.kv_budget_tokens)
    return tuple(simulate_policy(policy(setting, tail, seed), lengths, group, min_rounds))


def step_cost(setting: AsyncSetting, step_cost_name: str, train_gpus: int, colocated: bool, min_rounds: int,
              seed: int) -> NonRolloutCost:
    roofline = RooflineCost.from_presets(setting.hardware, setting.model, train_gpus, 1)
    if step_cost_name == "roofline":
        return roofline
    if step_cost_name != "shares":
        raise ValueError(f"step_cost must be 'shares' or 'roofline', got {step_cost_name!r}")
    shares = shares_from_baseline(sync_rounds(setting, setting.num_gpus, False, min_rounds, seed))
    return LinearStepCost(shares.train_s_per_token * setting.num_gpus / train_gpus, shares.reward_s_per_response,
                          0.0 if colocated else roofline.weight_sync_s())


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
                   partial: bool = True, min_rounds: int = 20, seed: int = 0) -> AsyncRun:
    """The async pipeline on `rollout_gpus` rollout GPUs, training priced by `cost`."""
    rollout, lengths = rollout_cost(setting, rollout_gpus), lengths_of(setting, seed)
    make = lambda rank: AsyncSimEngine(rollout, lengths, NUM_SLOTS, rollout.kv_budget_tokens,
                                       sync_s=cost.weight_sync_s(), partial=partial)
    sim = PolicySimulation(policy(setting, tail, seed), lengths, SimGroup(make, rollout.cluster.num_replicas))
    return AsyncPipeline(sim, cost, alpha).run_cycles(min_rounds)


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
        staleness_histogram=run.staleness_histogram, num_rounds=len(run.rounds),
        tokens_restarted=run.tokens_restarted, num_requeued=sum(len(r.requeued_problem_ids) for r in run.rounds))
