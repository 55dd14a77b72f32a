"""The off-policy losses against numbers worked out by hand, and the trainer's choice among them.

One response of two tokens: the trainer's log-probs (-1, -2), the rollout engine's (behaviour) log-probs
(-1.5, -1), advantage 2, token_mean over 2 tokens. So r = pi / mu = (e^0.5, e^-1) = (1.6487, 0.3679).
"""
from __future__ import annotations

import math

import pytest
import torch

from tailflow.config import OFF_POLICY_LOSSES, ConfigError, TrainConfig, load_config
from tailflow.engines.train.losses import (POLICY_LOSSES, cispo_loss, decoupled_ppo_loss, ppo_clip_loss, tis_loss,
                                           topr_loss)

R1, R2 = math.exp(0.5), math.exp(-1.0)
BEHAVIOUR = torch.tensor([[-1.5, -1.0]])
ADVANTAGE = torch.tensor([2.0])
MASK = torch.tensor([[1.0, 1.0]])


def loss_and_grad(compute):
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = compute(logprobs)
    loss.backward()
    return loss.item(), logprobs.grad[0].tolist(), stats


def test_tis_truncates_the_weight_at_one():
    loss, grad, stats = loss_and_grad(lambda lp: tis_loss(lp, BEHAVIOUR, ADVANTAGE, MASK))
    # weights (min(R1, 1), R2) = (1, 0.3679); loss = -(1 * 2 * -1 + R2 * 2 * -2) / 2
    assert loss == pytest.approx((2 + 4 * R2) / 2, rel=1e-6)
    assert grad == pytest.approx([-1.0, -R2], rel=1e-6)  # -w * A / 2
    assert stats.clip_fraction == pytest.approx(0.5)  # the first token's weight was truncated


def test_cispo_clips_the_weight_and_keeps_every_gradient():
    loss, grad, stats = loss_and_grad(lambda lp: cispo_loss(lp, BEHAVIOUR, ADVANTAGE, MASK, 0.2, 0.2))
    # weights (1.2, 0.8): both clipped; loss = (1.2 * 2 * 1 + 0.8 * 2 * 2) / 2 = 2.8
    assert loss == pytest.approx(2.8, rel=1e-6)
    assert grad == pytest.approx([-1.2, -0.8], rel=1e-6)
    assert stats.clip_fraction == pytest.approx(1.0)


def test_topr_is_plain_policy_gradient_for_positive_rewards_and_tis_otherwise():
    positive = loss_and_grad(lambda lp: topr_loss(lp, BEHAVIOUR, ADVANTAGE, torch.tensor([True]), MASK))
    assert positive[0] == pytest.approx(3.0) and positive[1] == pytest.approx([-1.0, -1.0])
    negative = loss_and_grad(lambda lp: topr_loss(lp, BEHAVIOUR, ADVANTAGE, torch.tensor([False]), MASK))
    tis = loss_and_grad(lambda lp: tis_loss(lp, BEHAVIOUR, ADVANTAGE, MASK))
    assert negative[0] == pytest.approx(tis[0]) and negative[1] == pytest.approx(tis[1])


def test_decoupled_ppo_weights_by_the_capped_proximal_over_behaviour_ratio():
    def compute(lp):
        return decoupled_ppo_loss(lp, lp.detach(), BEHAVIOUR, ADVANTAGE, MASK, 0.2, 0.2, is_cap=1.5)
    loss, grad, stats = loss_and_grad(compute)
    # the proximal policy is the current one (ratio 1): weights (min(R1, 1.5), R2) = (1.5, R2)
    assert loss == pytest.approx(-(1.5 * 2 + R2 * 2) / 2, rel=1e-6)
    assert grad == pytest.approx([-1.5, -R2], rel=1e-6)
    assert stats.approx_kl == pytest.approx(0.0) and stats.clip_fraction == 0.0


def test_ppo_against_the_behaviour_log_probs_clips_where_they_differ():
    loss, grad, stats = loss_and_grad(lambda lp: ppo_clip_loss(lp, BEHAVIOUR, ADVANTAGE, MASK, 0.2, 0.2))
    # A > 0: max(-A r, -A clip(r)) = -A * min(r, 1.2) for r > 1 and -A r below: (-2 * 1.2, -2 * R2)
    assert loss == pytest.approx(-(2 * 1.2 + 2 * R2) / 2, rel=1e-6)
    assert grad == pytest.approx([0.0, -R2], rel=1e-6)  # the clipped token has no gradient
    assert stats.clip_fraction == pytest.approx(0.5)


def test_config_and_losses_agree_on_the_losses_and_what_is_off_policy():
    assert TrainConfig.model_fields["loss"].annotation.__args__ == POLICY_LOSSES
    assert set(OFF_POLICY_LOSSES) < set(POLICY_LOSSES)


def test_truncated_sampling_needs_an_importance_correction():
    with pytest.raises(ConfigError, match="top_p 0.9.*importance-corrected train.loss"):
        load_config(None, ["rollout.top_p=0.9"])
    assert load_config(None, ["rollout.top_p=0.9", "train.loss=tis"]).train.loss == "tis"
    with pytest.raises(ConfigError, match="temperature 1"):
        load_config(None, ["rollout.temperature=0.7", "train.loss=cispo"])


# ---- through the trainer ----------------------------------------------------------------------------

def samples_with_zero_advantage_groups(seed: int = 0):
    """Six responses with rollout log-probs; the last three have advantage 0 (a group with no signal)."""
    import random

    from tailflow.engines.train.batch import TrainSample

    rng = random.Random(seed)
    samples = []
    for index, advantage in enumerate([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]):
        prompt = tuple(rng.randrange(3, 20) for _ in range(4))
        response = tuple(rng.randrange(3, 20) for _ in range(rng.randint(2, 8)))
        samples.append(TrainSample(prompt, response, advantage, tuple(-2.5 for _ in response),
                                   reward=float(index == 0)))
    return samples


def weights_after(model_path: str, samples, trained, loss: str = "ppo_clip"):
    from tailflow.engines.train.batch import count_response_tokens
    from tailflow.engines.train.trainer import PolicyTrainer

    trainer = PolicyTrainer(model_path, lr=1e-3, loss=loss, max_tokens_per_micro_batch=24)
    stats = trainer.train_step(trained, count_response_tokens(samples), len(samples),
                               count_response_tokens(trained))
    return trainer.full_state_dict(), stats


def test_skipping_zero_advantage_samples_keeps_the_gradient(random_tiny_model_dir):
    """Left out of the forward and backward, responses with no signal change nothing: the loss still
    divides by the whole batch's tokens."""
    from tailflow.engines.train.batch import count_response_tokens

    torch.set_num_threads(1)
    samples = samples_with_zero_advantage_groups()
    full, _ = weights_after(str(random_tiny_model_dir), samples, samples)
    skipped, stats = weights_after(str(random_tiny_model_dir), samples, samples[:3])
    assert max((full[k] - skipped[k]).abs().max().item() for k in full) < 1e-6
    assert max((full[k] - weights_after(str(random_tiny_model_dir), samples, samples[:2])[0][k]).abs().max().item()
               for k in full) > 1e-6  # leaving out a sample WITH signal does change the step
    assert stats.num_samples == 3
    assert stats.num_tokens == count_response_tokens(samples)  # the loss denominator is the whole batch's



@pytest.mark.parametrize("loss", POLICY_LOSSES)
def test_every_loss_trains_through_the_trainer(random_tiny_model_dir, loss):
    torch.set_num_threads(1)
    samples = samples_with_zero_advantage_groups()
    _, stats = weights_after(str(random_tiny_model_dir), samples, samples, loss)
    assert math.isfinite(stats.pg_loss) and math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    assert stats.logprob_diff_vs_rollout is not None
