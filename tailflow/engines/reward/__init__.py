"""Rewards: response text and gold answer in, a `RewardResult` out."""
from tailflow.engines.reward.math import MathReward, RewardResult

__all__ = ["MathReward", "RewardResult"]
