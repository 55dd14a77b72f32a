"""A whole training step from a simulated rollout round: rollout + reward + train + weight sync.

The synchronous step has no overlap (the paper's "+ tail batching" row has
neither streamed reward nor stream training), so a step is the sum. Reward
and train time come from a cost model's `reward_s` / `train_s`, or from a
baseline's stage shares (`shares_from_baseline`): given how a synchronous
step splits (RollPacker's Table 1: 72% rollout, 5% reward, 23% train for the
veRL baseline), the per-token train cost and per-response reward cost are
fixed on the *simulated synchronous* rounds and then charged to every round
by what it trains. That calibrates the baseline only; what tail batching
does to the step is still the simulator's prediction.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean
from typing import Sequence

from tailflow.engines.sim.costs import NonRolloutCost
from tailflow.engines.sim.simulate import SimRound


@dataclass(frozen=True)
class StageShares:
    rollout: float
    reward: float
    train: float


PAPER_TABLE1 = StageShares(rollout=0.72, reward=0.05, train=0.23)
"""RollPacker Table 1, math task, Qwen2.5-14B/16k on veRL (code 66/13/21, judge 71/7/22)."""


@dataclass(frozen=True)
class LinearStepCost:
    """Train time proportional to trained tokens, reward to scored responses, a fixed weight sync."""

    train_s_per_token: float
    reward_s_per_response: float
    sync_s: float = 0.0

    def train_s(self, num_tokens: int) -> float:
        return self.train_s_per_token * num_tokens

    def reward_s(self, num_responses: int, num_tokens: int) -> float:
        return self.reward_s_per_response * num_responses

    def weight_sync_s(self) -> float:
        return self.sync_s


def shares_from_baseline(sync_rounds: Sequence[SimRound], shares: StageShares = PAPER_TABLE1) -> LinearStepCost:
    """Per-token train and per-response reward costs that make the simulated synchronous step split as `shares`."""
    if not sync_rounds:
        raise ValueError("need at least one simulated synchronous round")
    rollout = mean(r.rollout_s for r in sync_rounds)
    tokens = mean(r.trained_tokens for r in sync_rounds)
    responses = mean(r.num_kept for r in sync_rounds)
    return LinearStepCost(train_s_per_token=shares.train / shares.rollout * rollout / tokens,
                          reward_s_per_response=shares.reward / shares.rollout * rollout / responses)


@dataclass(frozen=True)
class StepTime:
    rollout_s: float
    reward_s: float
    train_s: float
    sync_s: float

    @property
    def total_s(self) -> float:
        return self.rollout_s + self.reward_s + self.train_s + self.sync_s


def mean_step_time(rounds: Sequence[SimRound], cost: NonRolloutCost) -> StepTime:
    steps = [StepTime(r.rollout_s, cost.reward_s(r.num_kept, r.trained_tokens), cost.train_s(r.trained_tokens),
                      cost.weight_sync_s()) for r in rounds]
    return StepTime(*(mean(getattr(s, name) for s in steps) for name in ("rollout_s", "reward_s", "train_s", "sync_s")))
