"""Group-relative advantage estimators (one response group per prompt).

Every function takes `rewards` [G, R]: G prompts (groups) with R sampled
responses each, and returns advantages [G, R], one scalar per response that
the loss spreads over all of that response's tokens. Groups of different sizes
are the caller's business: call once per size, or pad nothing and loop.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch


def grpo_advantages(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, eq. in sec. 4.1.2).

        A[g, i] = (r[g, i] - mean_j r[g, j]) / (std_j r[g, j] + eps)

    `std` is the unbiased sample std (torch.std's default, divides by R - 1),
    as in TRL's and veRL's GRPO. A group whose rewards are all equal gets
    A = 0 (no signal). With `scale_by_std=False` this is Dr. GRPO (Liu et al.
    2025, "Understanding R1-Zero-Like Training"): A = r - mean, no std division,
    which removes the bias towards groups that are too easy or too hard.

    rewards: [G, R] float, R >= 2.  Returns [G, R].
    """
    rewards = rewards.float()
    if scale_by_std and rewards.shape[1] < 2:
        raise ValueError(f"GRPO's std needs at least 2 responses per group, got {rewards.shape[1]}")
    mean = rewards.mean(dim=1, keepdim=True)
    centered = rewards - mean
    if not scale_by_std:
        return centered
    std = rewards.std(dim=1, keepdim=True)
    return centered / (std + eps)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", eq. 5).

        A[g, i] = r[g, i] - 1/(R-1) * sum_{j != i} r[g, j]
                = R/(R-1) * (r[g, i] - mean_j r[g, j])

    Each response's baseline is the mean reward of the other R - 1 responses
    to the same prompt, so it is independent of the response itself (unbiased).

    rewards: [G, R] float, R >= 2.  Returns [G, R].
    """
    rewards = rewards.float()
    num_responses = rewards.shape[1]
    if num_responses < 2:
        raise ValueError(f"RLOO needs at least 2 responses per group, got {num_responses}")
    sum_others = rewards.sum(dim=1, keepdim=True) - rewards
    baseline = sum_others / (num_responses - 1)
    return rewards - baseline


ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "grpo": partial(grpo_advantages, scale_by_std=True),
    "dr_grpo": partial(grpo_advantages, scale_by_std=False),
    "rloo": rloo_advantages,
}


def compute_advantages(rewards: torch.Tensor, estimator: str) -> torch.Tensor:
    """Dispatch on the estimator's name: "grpo" | "dr_grpo" | "rloo".  [G, R] -> [G, R]."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {sorted(ESTIMATORS)}")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [G, R] (groups x responses), got shape {tuple(rewards.shape)}")
    return ESTIMATORS[estimator](rewards)
