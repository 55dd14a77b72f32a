"""Policy-gradient losses, token-level (DAPO, Yu et al. 2025, sec. 3.3).

Shapes: B rows (responses), T positions. `mask[b, t] = 1` where position t
predicts a response token the model sampled, so `logprobs[b, t]` is
log pi(token t+1 | <= t). In a multi-turn sample the environment's tokens
(observations) are in the rows as context but their positions have mask 0
(`TrainSample.response_mask`): every term below multiplies by the mask, so
they get no loss, KL or entropy and exactly zero gradient at their logits.

Token-level aggregation: every per-token term is summed and divided by the
number of response tokens in the WHOLE global batch (`num_tokens_total`, all
micro-batches on all ranks), not by this micro-batch's count. Summing the
gradients of the micro-batches (and of the ranks) then gives exactly the
gradient of the full-batch token mean, and long responses weigh per token,
not per sequence. With `num_tokens_total=None` the denominator is this
batch's own `mask.sum()` (the single-batch case).

Every returned stat follows the same rule, so stats of micro-batches and
ranks add up to the global token mean.

Loss aggregation (`train.loss_agg`). The loss terms (PPO and KL) may divide
their global token sum by another global count, `loss_denominator`
(`loss_denominator()` says which); the metrics (clip fraction, approx KL,
entropy) stay token means. Any such divisor is a count over the whole batch,
so micro-batches and ranks still add up exactly.

Every count above is of the model's tokens (`count_response_tokens`): with
multi-turn samples token_mean divides by the model tokens only,
seq_mean_token_sum sums each sample's model tokens and divides by samples,
and constant's sum is over model tokens too (its constant is the caller's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

import torch

if TYPE_CHECKING:
    from tailflow.config import TrainConfig

MAX_LOG_RATIO = 20.0
"""k3 exponentiates a log-ratio; clamp it so one wild token cannot give inf."""


LossAggregation = Literal["token_mean", "seq_mean_token_sum", "constant"]
LOSS_AGGREGATIONS: tuple[str, ...] = LossAggregation.__args__


def loss_denominator(
    loss_agg: LossAggregation, num_tokens: int, num_sequences: int, max_new_tokens: int | None = None
) -> int:
    """What the global sum of per-token losses is divided by; the counts are over the whole step's batch.

        token_mean          num_tokens                     DAPO (Yu et al. 2025, sec. 3.3): every token
                                                           weighs the same, a long response weighs more
        seq_mean_token_sum  num_sequences                  each response's token sum, averaged over responses
        constant            num_sequences * max_new_tokens Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
                                                           Training", sec. 3.1): a constant in place of each
                                                           response's length, so no length bias
    """
    if loss_agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss_agg {loss_agg!r}; choose one of {list(LOSS_AGGREGATIONS)}")
    if num_tokens < 1 or num_sequences < 1:
        raise ValueError(f"a batch needs >= 1 token and sequence, got {num_tokens} and {num_sequences}")
    if loss_agg == "token_mean":
        return num_tokens
    if loss_agg == "seq_mean_token_sum":
        return num_sequences
    if max_new_tokens is None or max_new_tokens < 1:
        raise ValueError(f"loss_agg 'constant' divides by num_sequences * max_new_tokens; got max_new_tokens "
                         f"{max_new_tokens!r}")
    return num_sequences * max_new_tokens


@dataclass(frozen=True)
class PPOStats:
    """Detached scalars that add across micro-batches: `pg_loss` is the loss (over the loss denominator), the
    others are sums over tokens / num_tokens_total."""

    pg_loss: float
    clip_fraction: float
    """Share of tokens where the clipped term won (their gradient is zero)."""
    approx_kl: float
    """k3 estimate of KL(old || new), Schulman 2020."""


def per_token(advantages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Advantages as [B, T] (or [B, 1], broadcast over the row): [B] is one per response (the group-relative
    estimators), [B, T] one per position (GAE, `gae.py`)."""
    return advantages.to(dtype).unsqueeze(1) if advantages.dim() == 1 else advantages.to(dtype)


def token_sum_over_total(values: torch.Tensor, mask: torch.Tensor, denominator: int | None) -> torch.Tensor:
    """sum_{b,t} values * mask / denominator  ([B, T], [B, T] -> scalar); None divides by mask.sum()."""
    divisor = mask.sum().clamp(min=1.0) if denominator is None else max(denominator, 1)
    return (values * mask).sum() / divisor


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    num_tokens_total: int | None = None,
    loss_denominator: int | None = None,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, PPOStats]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with DAPO's decoupled clip range.

        ratio    = exp(logprobs - old_logprobs)                       [B, T]
        pg_loss1 = -A * ratio                                         [B, T]
        pg_loss2 = -A * clip(ratio, 1 - clip_low, 1 + clip_high)      [B, T]
        loss     = sum(w * max(pg_loss1, pg_loss2) * mask) / loss_denominator   w: `weight` [B, T] (no grad), None: 1

    logprobs [B, T] (with grad), old_logprobs [B, T] (no grad), advantages [B]
    (one per response, broadcast over its tokens) or [B, T] (one per token), mask [B, T] in {0, 1}.
    `loss_denominator` None is num_tokens_total (token_mean). Returns the
    scalar loss and detached `PPOStats`.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs.detach()
    ratio = torch.exp(log_ratio)
    token_advantages = per_token(advantages, logprobs.dtype)
    pg_loss1 = -token_advantages * ratio
    pg_loss2 = -token_advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    if weight is not None:
        pg_loss = weight * pg_loss
    loss = token_sum_over_total(pg_loss, mask, num_tokens_total if loss_denominator is None else loss_denominator)
    with torch.no_grad():
        stats = PPOStats(
            pg_loss=loss.item(),
            clip_fraction=token_sum_over_total((pg_loss2 > pg_loss1).to(mask.dtype), mask, num_tokens_total).item(),
            approx_kl=token_sum_over_total((ratio - 1.0) - log_ratio, mask, num_tokens_total).item(),
        )
    return loss, stats


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    is_cap: float = 2.0,
    num_tokens_total: int | None = None,
    loss_denominator: int | None = None,
) -> tuple[torch.Tensor, PPOStats]:
    """Decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy optimization", eq. 3; AReaL):
    clip against the proximal policy, correct for the behaviour policy with a capped importance weight.

        w        = sg(min(exp(prox_logprobs - behaviour_logprobs), is_cap))      [B, T]
        ratio    = exp(logprobs - prox_logprobs)                                 [B, T]
        pg_loss  = w * max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
        loss     = sum(pg_loss * mask) / loss_denominator

    prox_logprobs [B, T]: the trainer's own log-probs at the start of the step (no grad).
    `clip_fraction` counts tokens where the clip won; `approx_kl` is k3 of the proximal ratio.
    """
    weight = torch.clamp(torch.exp(prox_logprobs - behaviour_logprobs), max=is_cap).detach()
    return ppo_clip_loss(logprobs, prox_logprobs, advantages, mask, clip_low, clip_high, num_tokens_total,
                         loss_denominator, weight=weight)


def weighted_pg_loss(
    logprobs: torch.Tensor,
    weight: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens_total: int | None,
    loss_denominator: int | None,
    truncated: torch.Tensor,
) -> tuple[torch.Tensor, PPOStats]:
    """The REINFORCE form the importance-weighted losses share:

        loss = sum(-sg(weight) * A * logprobs * mask) / loss_denominator

    `truncated` [B, T] marks tokens whose weight the clip changed (reported as `clip_fraction`);
    `approx_kl` is k3 of pi / mu (current over behaviour)."""
    mask = mask.to(logprobs.dtype)
    token_advantages = per_token(advantages, logprobs.dtype)
    pg_loss = -weight.detach() * token_advantages * logprobs
    loss = token_sum_over_total(pg_loss, mask, num_tokens_total if loss_denominator is None else loss_denominator)
    with torch.no_grad():
        log_ratio = torch.clamp(logprobs - behaviour_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
        stats = PPOStats(
            pg_loss=loss.item(),
            clip_fraction=token_sum_over_total(truncated.to(mask.dtype), mask, num_tokens_total).item(),
            approx_kl=token_sum_over_total(torch.exp(log_ratio) - 1.0 - log_ratio, mask, num_tokens_total).item(),
        )
    return loss, stats


def behaviour_ratio(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor) -> torch.Tensor:
    """r = pi / mu = exp(logprobs - behaviour_logprobs), detached, the log clamped to +-MAX_LOG_RATIO.  [B, T]"""
    return torch.exp(torch.clamp(logprobs.detach() - behaviour_logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO))


def tis_loss(logprobs, behaviour_logprobs, advantages, mask, num_tokens_total=None, loss_denominator=None):
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"; IMPALA's truncation):

        loss = sum(-sg(clip(r, 0, 1)) * A * logprobs * mask) / loss_denominator,   r = pi / mu   [B, T]
    """
    ratio = behaviour_ratio(logprobs, behaviour_logprobs)
    return weighted_pg_loss(logprobs, torch.clamp(ratio, 0.0, 1.0), behaviour_logprobs, advantages, mask,
                            num_tokens_total, loss_denominator, truncated=ratio > 1.0)


def cispo_loss(logprobs, behaviour_logprobs, advantages, mask, eps_low=0.2, eps_high=0.2, num_tokens_total=None,
               loss_denominator=None):
    """CISPO (MiniMax-M1, 2025, eq. 4): clip the importance weight, never the gradient, so every token
    keeps a gradient:

        loss = sum(-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * logprobs * mask) / loss_denominator   [B, T]
    """
    ratio = behaviour_ratio(logprobs, behaviour_logprobs)
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return weighted_pg_loss(logprobs, weight, behaviour_logprobs, advantages, mask, num_tokens_total,
                            loss_denominator, truncated=weight != ratio)


def topr_loss(logprobs, behaviour_logprobs, advantages, mask, num_tokens_total=None, loss_denominator=None):
    """TOPR (Le Roux et al. 2025, "Tapered Off-Policy REINFORCE", eq. 9): plain policy gradient for responses
    with a positive advantage, truncated importance sampling for the rest:

        weight = 1 where A[b] > 0, else clip(r, 0, 1),   r = pi / mu                     [B, T]
        loss   = sum(-sg(weight) * A * logprobs * mask) / loss_denominator

    The positive set is chosen by the sign of the advantage, the paper's R - b (its baseline form), never by
    the reward alone: with partial credit, a format reward or judge scores every reward may be positive, and a
    below-baseline response would then be pushed down with weight 1, untruncated, which is what TOPR exists
    to prevent. A = 0 has no gradient either way.

    Where this differs from the paper: the paper truncates the SEQUENCE ratio pi(tau) / mu(tau) (one weight per
    response); here r is the per-token ratio, each token's weight truncated on its own (as `tis_loss` does), so
    a response's tokens may get different weights. The per-token form is what the other importance-weighted
    losses here use and stays finite for long responses, where a product of hundreds of ratios does not.
    """
    ratio = behaviour_ratio(logprobs, behaviour_logprobs)
    positive = per_token(advantages, ratio.dtype) > 0
    weight = torch.where(positive, torch.ones_like(ratio), torch.clamp(ratio, 0.0, 1.0))
    return weighted_pg_loss(logprobs, weight, behaviour_logprobs, advantages, mask, num_tokens_total,
                            loss_denominator, truncated=~positive & (ratio > 1.0))


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss may read for one micro-batch ([B, T] unless said): the trainer fills it once and the
    table below picks what each loss takes."""

    logprobs: torch.Tensor
    """The current policy's log-probs (with grad)."""
    proximal: torch.Tensor
    """The log-probs of the weights at the start of the step (no grad)."""
    behaviour: torch.Tensor
    """The rollout engine's log-probs of the sampled tokens (the behaviour policy)."""
    advantages: torch.Tensor
    """[B], one per response, or [B, T], one per token (GAE)."""
    mask: torch.Tensor
    num_tokens_total: int | None
    """What the reported token means divide by."""
    loss_denominator: int | None
    """What the loss divides by (`loss_denominator()`)."""

    @property
    def args(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, mask), the two arguments every loss takes after its log-probs."""
        return self.advantages, self.mask

    @property
    def totals(self) -> dict[str, int | None]:
        """The divisors, as every loss takes them (keywords)."""
        return dict(num_tokens_total=self.num_tokens_total, loss_denominator=self.loss_denominator)


@dataclass(frozen=True)
class LossSpec:
    """One `train.loss`: how the trainer calls it, and what it needs."""

    compute: Callable[[PolicyLossInputs, TrainConfig], tuple[torch.Tensor, PPOStats]]
    """The loss and its stats for one micro-batch, with `train.clip_low`, `clip_high`, `is_cap` as it takes them."""
    off_policy: bool
    """It corrects for the behaviour (rollout) policy with its log-probs, so it allows responses sampled by other
    weights (async training) or by a truncated distribution (top-p, top-k); the trainer refuses samples without
    those log-probs or sampled at another temperature."""
    proximal: bool
    """It clips against the proximal policy (the weights at the start of the step): with several optimizer updates
    per step the trainer computes its log-probs once before the first; the others never read it."""


LOSSES: dict[str, LossSpec] = {
    "ppo_clip": LossSpec(
        lambda x, t: ppo_clip_loss(x.logprobs, x.proximal, *x.args, t.clip_low, t.clip_high, **x.totals),
        off_policy=False, proximal=True),
    "ppo_behaviour": LossSpec(
        lambda x, t: ppo_clip_loss(x.logprobs, x.behaviour, *x.args, t.clip_low, t.clip_high, **x.totals),
        off_policy=True, proximal=False),
    "decoupled_ppo": LossSpec(
        lambda x, t: decoupled_ppo_loss(x.logprobs, x.proximal, x.behaviour, *x.args, t.clip_low, t.clip_high,
                                        t.is_cap, **x.totals),
        off_policy=True, proximal=True),
    "tis": LossSpec(
        lambda x, t: tis_loss(x.logprobs, x.behaviour, *x.args, **x.totals),
        off_policy=True, proximal=False),
    "cispo": LossSpec(
        lambda x, t: cispo_loss(x.logprobs, x.behaviour, *x.args, t.clip_low, t.clip_high, **x.totals),
        off_policy=True, proximal=False),
    "topr": LossSpec(
        lambda x, t: topr_loss(x.logprobs, x.behaviour, *x.args, **x.totals),
        off_policy=True, proximal=False),
}
"""Every `train.loss`, the one table: the trainer dispatches on it, and the lists below are read off it.
tailflow/config.py imports nothing of engines/ (this module imports torch), so it spells the names
(`TrainConfig.loss`) and the off-policy ones (`OFF_POLICY_LOSSES`) again; tests/test_offpolicy_losses.py fails
until they equal this table's."""
POLICY_LOSSES: tuple[str, ...] = tuple(LOSSES)
OFF_POLICY_LOSSES: tuple[str, ...] = tuple(name for name, spec in LOSSES.items() if spec.off_policy)
PROXIMAL_LOSSES: tuple[str, ...] = tuple(name for name, spec in LOSSES.items() if spec.proximal)


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    loss_denominator: int | None = None,
) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) (Schulman 2020, "Approximating KL divergence"), as in GRPO eq. 4.

        log_r = ref_logprobs - logprobs                               [B, T]
        k3    = exp(log_r) - log_r - 1        (>= 0, unbiased for tokens sampled from pi)
        kl    = sum(k3 * mask) / loss_denominator     (None: this batch's mask.sum())

    log_r is clamped to +-MAX_LOG_RATIO before exp. Returns a scalar with grad
    through `logprobs`.
    """
    mask = mask.to(logprobs.dtype)
    log_ratio = torch.clamp(ref_logprobs.detach() - logprobs, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    k3 = torch.exp(log_ratio) - log_ratio - 1.0
    return token_sum_over_total(k3, mask, loss_denominator)


def entropy_from_logits(logits: torch.Tensor, mask: torch.Tensor, num_tokens_total: int | None = None) -> torch.Tensor:
    """Token-level mean entropy of the policy.

        p = softmax(logits);  H[b, t] = logsumexp(logits[b, t]) - sum_v p[b, t, v] * logits[b, t, v]
        entropy = sum(H * mask) / num_tokens_total

    logits [B, T, V], mask [B, T].  Returns a scalar.
    """
    probs = torch.softmax(logits, dim=-1)
    token_entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
    return token_sum_over_total(token_entropy, mask.to(token_entropy.dtype), num_tokens_total)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t+1] | input_ids[:, <= t]) at position t.

    logits [B, T, V], input_ids [B, T] -> [B, T]; the last column has no next
    token and is 0 (the response mask is 0 there too).
    """
    next_logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    gathered = next_logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(gathered, (0, 1), value=0.0)
