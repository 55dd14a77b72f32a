"""The paper's settings as the async and spot modes simulate them, and their synchronous rounds and step costs.

`sync_rounds` is the existing synchronous simulation (bench/sim_paper.py's
`simulate_cell`: the policy on `roofline` replicas with the paper-like
lengths), on any number of rollout GPUs. Step costs (`step_cost`):

* `shares` (as `bench/sim_validate.py`): reward and train time fixed on the
  colocated synchronous rounds by the paper's Table 1 shares (72% rollout,
  5% reward, 23% train); train time scales as all GPUs / trainer GPUs;
  weight sync 0 when colocated (inside Table 1's train share, as the
  existing prediction) and one copy of the weights over the network between
  disaggregated pools (the roofline's `weight_sync_s`);
* `roofline`: the roofline's train time on the trainer pool's GPUs, no
  reward, the roofline's weight sync in every case.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySettings, SimRound, simulate_policy
from tailflow.engines.sim.step_time import LinearStepCost, NonRolloutCost, shares_from_baseline

NUM_SLOTS = 2048
"""vLLM's max_num_seqs in RollPacker's example config (as bench/sim_paper.py)."""
NUM_PROMPTS = 20_000


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
