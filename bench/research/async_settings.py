"""The paper's settings as the async and spot predictions simulate them: their runs and step costs.

`simulate_run` is the product's pipeline on `roofline` replicas of a number
of rollout GPUs with the paper-like lengths (as research/paper.py's
`simulate_cell`), synchronous or running ahead of training. Step costs
(`step_cost`):

* `shares` (as `bench/sim_validate.py`): reward and train time fixed on the
  colocated synchronous rounds by the paper's Table 1 shares (72% rollout,
  5% reward, 23% train); train time scales as all GPUs / trainer GPUs;
  weight sync 0 when colocated (inside Table 1's train share, as the
  existing prediction) and the roofline's weight transfer to the rollout
  replicas between disaggregated pools;
* `roofline`: the roofline's train time on the trainer pool's GPUs, no
  reward, the roofline's weight sync in every case.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from research.paper import NUM_PROMPTS, NUM_SLOTS, PAPER, PaperSetting

from tailflow.engines.sim.costs import NonRolloutCost
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.sim_run import SimRun
from tailflow.engines.sim.simulate import PolicySimulation, SimRound
from tailflow.engines.sim.step_time import LinearStepCost, shares_from_baseline
from tailflow.engines.tail.state import TailSettings


@dataclass(frozen=True)
class AsyncSetting:
    """A model on a number of GPUs with the paper's policy sizes (research/paper.py's settings, or any other)."""

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

    @classmethod
    def of(cls, paper: PaperSetting) -> "AsyncSetting":
        return cls(paper.name, paper.model, paper.num_gpus, paper.tp, paper.max_new_tokens)


SETTINGS = {key: AsyncSetting.of(paper) for key, paper in zip(("7b", "14b", "32b"), PAPER)}


def setting_for(preset_name: str) -> AsyncSetting:
    try:
        return SETTINGS[preset_name.lower()]
    except KeyError:
        raise ValueError(f"unknown async preset {preset_name!r}; known: {', '.join(SETTINGS)}") from None


def policy(setting: AsyncSetting, tail: bool, seed: int) -> TailSettings:
    if not tail:
        return TailSettings(setting.prompts_per_step, setting.responses_kept, enabled=False, data_seed=seed)
    return TailSettings(setting.prompts_per_step, setting.responses_kept, setting.prompt_ratio,
                        setting.responses_launched, data_seed=seed)


def rollout_cost(setting: AsyncSetting, num_gpus: int) -> RooflineCost:
    return RooflineCost.from_presets(setting.hardware, setting.model, num_gpus, setting.tp)


def lengths_of(setting: AsyncSetting, seed: int) -> PaperLikeLengths:
    return paper_lengths(setting.max_new_tokens, seed)


@lru_cache(maxsize=8)
def paper_lengths(max_new_tokens: int, seed: int) -> PaperLikeLengths:
    """Shared by the simulations of one cap and seed (building 20,000 prompts' difficulties takes a second); safe
    because a request's length is a pure function of (seed, round, request), pinned when its round launches it."""
    return PaperLikeLengths(NUM_PROMPTS, max_new_tokens, seed)


def simulate_run(setting: AsyncSetting, num_gpus: int, tail: bool, min_rounds: int, seed: int, alpha: float = 0.0,
                 partial: bool = True, trainer: NonRolloutCost | None = None) -> SimRun:
    """The product's pipeline on `num_gpus` rollout GPUs at `alpha`, training priced by `trainer`."""
    cost, lengths = rollout_cost(setting, num_gpus), lengths_of(setting, seed)
    group = SimGroup.of(cost, lengths, cost.cluster.num_replicas, NUM_SLOTS, cost.kv_budget_tokens)
    return PolicySimulation(policy(setting, tail, seed), lengths, group, alpha, partial, trainer).run(min_rounds)


@lru_cache(maxsize=64)
def sync_rounds(setting: AsyncSetting, num_gpus: int, tail: bool, min_rounds: int, seed: int) -> tuple[SimRound, ...]:
    """The synchronous simulation (as research/paper.py's simulate_cell) on `num_gpus` rollout GPUs."""
    return simulate_run(setting, num_gpus, tail, min_rounds, seed).rounds


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
