"""Which reward function a run uses, as a small picklable record, and building it where it runs.

The driver turns the config into a `RewardSpec`; each reward worker (a Ray actor, maybe on another node)
builds its own function from it, so nothing heavy (a checker child, a sandbox probe, a judge model)
crosses the wire.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RewardSpec:
    type: str
    """math, code or judge"""
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of that function's constructor."""

    @property
    def runs_code(self) -> bool:
        """The reward runs the response as a program: code datasets, per-test timeouts and their anchors."""
        return self.type == "code"


def reward_spec(reward_config, policy_model_path: str) -> RewardSpec:
    """From the `reward` config section; the judge defaults to the policy's initial model."""
    r = reward_config
    if r.type == "math":
        return RewardSpec("math", dict(format_reward=r.format_reward, answer_marker=r.answer_marker,
                                       literal_answers_only=r.literal_answers_only))
    if r.type == "code":
        return RewardSpec("code", dict(all_or_nothing=r.all_or_nothing, backend=r.sandbox,
                                       memory_mb=r.sandbox_memory_mb, max_processes=r.sandbox_max_processes,
                                       timeout_max_s=r.timeout_max_s, budget_s=r.code_budget_s))
    if r.type == "judge":
        return RewardSpec("judge", dict(model_path=r.judge_model_path or policy_model_path,
                                        template=r.judge_template, yes_text=r.judge_yes, no_text=r.judge_no))
    raise ValueError(f"reward.type: unknown reward {r.type!r}")


def build_reward(spec: RewardSpec):
    """The reward function object: anything with `score_problem(text, problem, timeout_s) -> RewardResult`, and
    `close()` where it holds something to release (`RewardWorker.close`)."""
    if spec.type == "math":
        from tailflow.engines.reward.math import MathReward

        return MathReward(**spec.options)
    if spec.type == "code":
        from tailflow.engines.reward.code import CodeReward

        return CodeReward(**spec.options)
    if spec.type == "judge":
        from tailflow.engines.reward.judge import JudgeReward

        return JudgeReward(**spec.options)
    raise ValueError(f"reward.type: unknown reward {spec.type!r}")
