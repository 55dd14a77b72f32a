"""Per-token advantages from a learned value (GAE), and the critic's clipped value loss (train.advantage: gae).

A response's steps are its MODEL tokens only: the environment's observation tokens of a multi-turn trajectory
are the environment's move, folded into the step from one model token to the next, so they get no value, no
reward, no advantage and no value loss. For model token k of n (0-based, skipping observations):

    V_k      the critic's value at the position that predicts token k: the state the model sampled it from
    r_k      the reward paid after token k: each turn's environment reward at the turn's last model token, and
             the rest of the response's reward (a single-turn response's all of it; `env.reward: verifier`'s
             all of it) at its last model token; 0 elsewhere
    delta_k  = r_k + gamma * V_{k+1} - V_k,   V_n = 0
    A_k      = delta_k + gamma * lambda * A_{k+1},   A_n = 0          Schulman et al. 2016, eq. 16
    R_k      = A_k + V_k                                              the critic's target (the lambda-return)

V_n = 0 for every trained response, a truncated one too (cut by max_new_tokens, a turn or trajectory limit,
max_turns): its reward was paid on what it wrote, and no later state will pay anything, so there is nothing to
bootstrap (a time limit in an MDP that goes on would be bootstrapped; an RLVR response or a trajectory the
environment scored at its cut does not go on).

The value loss (PPO's, as in OpenAI's baselines and veRL): the new value may move at most `clip` from the value
the advantages were computed with, and the worse of the clipped and unclipped squared errors is taken:

    V_clip   = V_old + clamp(V - V_old, -clip, clip)
    loss     = 1/2 * sum(max((V - R)^2, (V_clip - R)^2) * mask) / num_tokens_total

The clip fraction counts the tokens where the clipped error is the larger (their gradient is zero).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import accumulate

import torch

from tailflow.engines.reward.scoring import ScoredResponse
from tailflow.engines.train.batch import TrainSample


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One response's model tokens: rewards [n] and values [n] (V_0 .. V_{n-1}; V_n = 0) -> (advantages [n],
    returns [n]). The recursion runs in float64 and is rounded to the values' dtype once."""
    if rewards.shape != values.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and values must be one [n] vector each, got {tuple(rewards.shape)} and "
                         f"{tuple(values.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lambda must be in [0, 1], got {gamma} and {lam}")
    rewards64, values64 = rewards.double(), values.double()
    next_values = torch.cat([values64[1:], values64.new_zeros(1)])
    deltas = rewards64 + gamma * next_values - values64
    advantages = torch.empty_like(deltas)
    running = 0.0
    for k in range(len(deltas) - 1, -1, -1):
        running = float(deltas[k]) + gamma * lam * running
        advantages[k] = running
    return advantages.to(values.dtype), (advantages + values64).to(values.dtype)


def token_rewards(model_tokens: int, turn_ends: list[int], turn_rewards: list[float]) -> torch.Tensor:
    """[n] rewards over a response's model tokens: turn i's reward at its last model token `turn_ends[i]` (an
    index among the model tokens), 0 elsewhere."""
    if len(turn_ends) != len(turn_rewards):
        raise ValueError(f"{len(turn_ends)} turn ends for {len(turn_rewards)} turn rewards")
    rewards = torch.zeros(model_tokens, dtype=torch.float32)
    for end, reward in zip(turn_ends, turn_rewards):
        if not 0 <= end < model_tokens:
            raise ValueError(f"a turn ends at model token {end} of {model_tokens}")
        rewards[end] += reward
    return rewards


def model_token_rewards(response: ScoredResponse, per_turn: bool) -> torch.Tensor:
    """[n] rewards over the response's model tokens (the module docstring's r_k). `per_turn`: a trajectory's
    turn rewards land at their turns' ends (env.reward environment or sum); else its whole reward at the end."""
    completion = response.completion
    mask = completion.response_mask or (True,) * len(completion.token_ids)
    num_model_tokens = sum(mask)
    outcome = completion.outcome
    if outcome is None or not per_turn:
        return token_rewards(num_model_tokens, [num_model_tokens - 1], [response.reward])
    # a turn without a model token (never sampled) ends where the turn before it did
    ends = [max(end - 1, 0) for end in accumulate(outcome.action_lengths)]
    turn_rewards = list(outcome.turn_rewards[:len(ends)])
    rest = response.reward - sum(turn_rewards)  # the verifier's share (env.reward sum); 0 for environment
    return token_rewards(num_model_tokens, ends + [num_model_tokens - 1], turn_rewards + [rest])


def with_gae(sample: TrainSample, rewards: torch.Tensor, values: tuple[float, ...], gamma: float,
             lam: float) -> TrainSample:
    """`sample` with its per-token advantages, values and returns: `values` has one per response token (the
    critic's at the positions that predict them); the environment's tokens get 0.0 in all three."""
    mask = model_flags(sample)
    if len(values) != len(mask):
        raise ValueError(f"{len(values)} values for {len(mask)} response tokens")
    model_positions = [i for i, is_model in enumerate(mask) if is_model]
    model_values = torch.tensor([values[i] for i in model_positions], dtype=torch.float32)
    advantages, returns = gae_advantages(rewards, model_values, gamma, lam)
    token_advantages, token_values, token_returns = ([0.0] * len(mask) for _ in range(3))
    for k, i in enumerate(model_positions):
        token_advantages[i], token_values[i], token_returns[i] = (float(advantages[k]), float(model_values[k]),
                                                                  float(returns[k]))
    return replace(sample, token_advantages=tuple(token_advantages), values=tuple(token_values),
                   returns=tuple(token_returns))


def whitened(samples: list[TrainSample]) -> list[TrainSample]:
    """The samples' token advantages normalised to mean 0, std 1 over every model token of the step (`whiten`)."""
    flat = torch.tensor([a for s in samples for a, m in zip(s.token_advantages, model_flags(s)) if m],
                        dtype=torch.float64)
    if len(flat) < 2:
        return samples
    mean, std = flat.mean(), flat.std(unbiased=False)
    scale = 1.0 / float(torch.sqrt(std ** 2 + 1e-8))
    return [replace(s, token_advantages=tuple((a - float(mean)) * scale if m else 0.0
                                              for a, m in zip(s.token_advantages, model_flags(s))))
            for s in samples]


def model_flags(sample: TrainSample) -> tuple[bool, ...]:
    return sample.response_mask or (True,) * sample.num_response_tokens


@dataclass(frozen=True)
class ValueLossStats:
    """Detached sums over tokens / num_tokens_total, so micro-batches and ranks add up to the batch's means."""

    vf_loss: float
    clip_fraction: float
    vpred_mean: float


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip: float, num_tokens_total: int | None = None) -> tuple[torch.Tensor, ValueLossStats]:
    """values [B, T] (with grad), old_values and returns [B, T] (no grad), mask [B, T] in {0, 1}; `clip` <= 0
    turns the clipping off. `num_tokens_total` None divides by this batch's mask sum."""
    mask = mask.to(values.dtype)
    divisor = mask.sum().clamp(min=1.0) if num_tokens_total is None else max(num_tokens_total, 1)
    old_values, returns = old_values.detach(), returns.detach()
    unclipped = (values - returns) ** 2
    if clip > 0:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clip_hits = (clipped > unclipped).to(values.dtype)
    else:
        per_token, clip_hits = unclipped, torch.zeros_like(unclipped)
    loss = 0.5 * (per_token * mask).sum() / divisor
    with torch.no_grad():
        stats = ValueLossStats(float(loss), float((clip_hits * mask).sum() / divisor),
                               float((values * mask).sum() / divisor))
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the masked tokens: 1 is a perfect critic, 0 one no better than the mean,
    below 0 worse; nan when the returns do not vary."""
    mask = mask.to(torch.float64)
    count = mask.sum()
    if count < 2:
        return float("nan")

    def variance(x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        mean = (x * mask).sum() / count
        return (((x - mean) * mask) ** 2).sum() / count

    spread = variance(returns)
    return float("nan") if spread == 0 else float(1 - variance(returns - values) / spread)


def samples_explained_variance(samples: list[TrainSample]) -> float:
    """`explained_variance` of the samples' values against their returns, over their model tokens."""
    pairs = [(v, r) for s in samples if s.values is not None
             for v, r, m in zip(s.values, s.returns, model_flags(s)) if m]
    if not pairs:
        return float("nan")
    values, returns = torch.tensor(pairs, dtype=torch.float64).T
    return explained_variance(values, returns, torch.ones_like(values))
