"""Scored groups -> training samples: where rewards become advantages.

Groups whose responses all got the same reward carry no GRPO signal (every
advantage is 0); they are kept so token counts match the paper's
token-level aggregation, and counted in `num_zero_signal_groups`.
"""
from __future__ import annotations

from typing import Sequence

import torch

from tailflow.engines.reward.scoring import ScoredGroup
from tailflow.engines.train.advantages import compute_advantages
from tailflow.engines.train.batch import TrainSample


def samples_from_groups(groups: Sequence[ScoredGroup], estimator: str) -> list[TrainSample]:
    """One TrainSample per response; groups must all have the same size (R0)."""
    if not groups:
        return []
    sizes = {len(group.responses) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"every group must hold the same number of responses, got sizes {sorted(sizes)}")
    rewards = torch.tensor([group.rewards for group in groups], dtype=torch.float32)  # [G, R]
    advantages = compute_advantages(rewards, estimator)  # [G, R]
    samples = []
    for group, group_advantages in zip(groups, advantages.tolist()):
        for response, advantage in zip(group.responses, group_advantages):
            completion = response.completion
            samples.append(
                TrainSample(
                    prompt_token_ids=tuple(completion.prompt_token_ids),
                    response_token_ids=tuple(completion.token_ids),
                    advantage=float(advantage),
                    rollout_logprobs=tuple(completion.logprobs),
                )
            )
    return samples


def num_zero_signal_groups(groups: Sequence[ScoredGroup]) -> int:
    return sum(1 for group in groups if len(set(group.rewards)) <= 1)
