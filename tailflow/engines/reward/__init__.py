"""Rewards: response text and gold answer in, a `RewardResult` out.

`MathReward` and `RewardResult` are loaded on first use: the code reward's test
runner is a short-lived process of its own, and importing the math verifier
(sympy) would more than double its start-up.
"""


def __getattr__(name: str):
    if name == "MathReward":
        from tailflow.engines.reward.math import MathReward

        return MathReward
    if name == "RewardResult":
        from tailflow.engines.reward.result import RewardResult

        return RewardResult
    raise AttributeError(f"module 'tailflow.engines.reward' has no attribute {name!r}")


__all__ = ["MathReward", "RewardResult"]
