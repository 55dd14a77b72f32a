"""Group-relative advantage estimators (one response group per prompt).

Every function takes `rewards` [G, R]: G prompts (groups) with R sampled
responses each, and returns advantages [G, R], one scalar per response that
the loss spreads over all of that response's tokens. Groups of different sizes
are the caller's business: call once per size, or pad nothing and loop.

A group whose rewards are all equal carries no signal, and every estimator
gives it advantage exactly 0.0 (`has_equal_rewards`). Arithmetic alone does
not: in float32 the mean of eight 0.1s differs from 0.1 by an ulp, so
`r - mean` is ~1e-8 and GRPO's `/ (std + eps)` turns it into a same-sign
advantage of 0.007 to 0.056 for the whole group (0.1, 0.7, 2/3, 0.8: a
format reward, a code answer passing the same share of tests, tied judge
scores). Such a group would be trained while counted as having no signal.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch


def has_equal_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """[G, R] -> [G] bool: every response of the group got exactly the same reward (compared as the float32
    values the estimators compute with): a group with no signal."""
    rewards = rewards.float()
    return (rewards == rewards[:, :1]).all(dim=1)


def zero_where_equal(advantages: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """Advantages [G, R] with the rows of equal-reward groups set to exactly 0.0 (rounding left them ~1e-8)."""
    return advantages.masked_fill(has_equal_rewards(rewards)[:, None], 0.0)


def grpo_advantages(rewards: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, eq. in sec. 4.1.2).

        A[g, i] = (r[g, i] - mean_j r[g, j]) / (std_j r[g, j] + eps)

    `std` is the unbiased sample std (torch.std's default, divides by R - 1),
    as in TRL's and veRL's GRPO. A group whose rewards are all equal gets
    A = 0.0 exactly (no signal; `zero_where_equal`). With `scale_by_std=False` this is Dr. GRPO (Liu et al.
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
        return zero_where_equal(centered, rewards)
    std = rewards.std(dim=1, keepdim=True)
    return zero_where_equal(centered / (std + eps), rewards)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", eq. 5).

        A[g, i] = r[g, i] - 1/(R-1) * sum_{j != i} r[g, j]
                = R/(R-1) * (r[g, i] - mean_j r[g, j])

    Each response's baseline is the mean reward of the other R - 1 responses
    to the same prompt, so it is independent of the response itself (unbiased).
    A group whose rewards are all equal gets A = 0.0 exactly.

    rewards: [G, R] float, R >= 2.  Returns [G, R].
    """
    rewards = rewards.float()
    num_responses = rewards.shape[1]
    if num_responses < 2:
        raise ValueError(f"RLOO needs at least 2 responses per group, got {num_responses}")
    sum_others = rewards.sum(dim=1, keepdim=True) - rewards
    baseline = sum_others / (num_responses - 1)
    return zero_where_equal(rewards - baseline, rewards)


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
