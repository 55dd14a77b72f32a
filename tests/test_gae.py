"""GAE and the clipped value loss (engines/train/gae.py) against cases worked by hand: gamma and lambda, the
environment's tokens masked out of the chain, a truncated response, and the value clip in both directions."""
from __future__ import annotations

import math

import pytest
import torch

from tailflow.engines.env.trajectory import StopReason, TrajectoryOutcome
from tailflow.engines.reward.scoring import ScoredResponse
from tailflow.engines.rollout.protocol import Completion, FinishReason
from tailflow.engines.train.batch import TrainSample, collate
from tailflow.engines.train.gae import (clipped_value_loss, explained_variance, gae_advantages, model_token_rewards,
                                        token_rewards, whitened, with_gae)
from tailflow.engines.train.losses import ppo_clip_loss


def approx(values, expected) -> bool:
    return [float(v) for v in values] == pytest.approx(expected, abs=1e-6)


def test_gae_against_a_hand_computed_case():
    rewards, values = torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7])
    # deltas: 0 + .9 * .6 - .5 = .04, 0 + .9 * .7 - .6 = .03, 1 + 0 - .7 = .3 (V_3 = 0); gamma * lambda = .72
    advantages, returns = gae_advantages(rewards, values, gamma=0.9, lam=0.8)
    assert approx(advantages, [0.04 + 0.72 * (0.03 + 0.72 * 0.3), 0.03 + 0.72 * 0.3, 0.3])
    assert approx(returns, [0.21712 + 0.5, 0.246 + 0.6, 1.0])


def test_gae_limits_monte_carlo_and_one_step():
    rewards, values = torch.tensor([0.0, 2.0, 1.0]), torch.tensor([0.5, 0.6, 0.7])
    advantages, returns = gae_advantages(rewards, values, gamma=1.0, lam=1.0)
    assert approx(advantages, [3 - 0.5, 3 - 0.6, 1 - 0.7]) and approx(returns, [3.0, 3.0, 1.0])  # reward to go - V
    advantages, _ = gae_advantages(rewards, values, gamma=0.5, lam=0.0)
    assert approx(advantages, [0 + 0.5 * 0.6 - 0.5, 2 + 0.5 * 0.7 - 0.6, 1 - 0.7])  # one-step TD errors
    with pytest.raises(ValueError, match="gamma and lambda"):
        gae_advantages(rewards, values, gamma=1.5, lam=1.0)
    with pytest.raises(ValueError, match="one \\[n\\] vector"):
        gae_advantages(rewards, values[:2], gamma=1.0, lam=1.0)


def trajectory_response(reward: float) -> ScoredResponse:
    """Two turns: 2 model tokens, 2 observation tokens, 1 model token; the environment paid .25 then .5."""
    mask = (True, True, False, False, True)
    outcome = TrajectoryOutcome(StopReason.DONE, (0.25, 0.5), (0.0, 0.1, 0.1), (2, 1))
    completion = Completion("p-0", (1, 2), (3, 4, 5, 6, 7), (-0.5,) * 5, FinishReason.STOP, 0, problem_id="p",
                            response_mask=mask, outcome=outcome)
    return ScoredResponse(completion, "", reward, True)


def test_rewards_land_on_turn_ends_and_a_truncated_response_ends_its_chain():
    assert token_rewards(7, [2, 6], [0.25, 1.0]).tolist() == [0, 0, 0.25, 0, 0, 0, 1.0]
    with pytest.raises(ValueError, match="ends at model token 7 of 7"):
        token_rewards(7, [7], [1.0])
    # environment-paid: each turn's reward at its last model token; a verifier's extra at the very end
    assert model_token_rewards(trajectory_response(0.75), per_turn=True).tolist() == [0.0, 0.25, 0.5]
    assert model_token_rewards(trajectory_response(1.75), per_turn=True).tolist() == [0.0, 0.25, 1.5]
    assert model_token_rewards(trajectory_response(1.0), per_turn=False).tolist() == [0.0, 0.0, 1.0]
    # a single-turn response cut by max_new_tokens is scored on what it wrote: its reward at its last token,
    # and nothing after it (V_n = 0, no bootstrap), exactly as one that ended by itself
    cut = Completion("q-0", (1,), (3, 4, 5), (-0.1,) * 3, FinishReason.LENGTH, 0, problem_id="q")
    ended = Completion("q-1", (1,), (3, 4, 5), (-0.1,) * 3, FinishReason.EOS, 0, problem_id="q")
    for completion in (cut, ended):
        rewards = model_token_rewards(ScoredResponse(completion, "", 0.5, False), per_turn=True)
        assert rewards.tolist() == [0.0, 0.0, 0.5]
        sample = TrainSample((1,), (3, 4, 5), 0.0)
        assert approx(with_gae(sample, rewards, (0.1, 0.2, 0.3), 1.0, 1.0).token_advantages, [0.4, 0.3, 0.2])


def test_the_environments_tokens_are_skipped_by_the_chain_and_get_nothing():
    response = trajectory_response(0.75)
    sample = TrainSample((1, 2), (3, 4, 5, 6, 7), 0.0, response_mask=response.completion.response_mask)
    values = (0.1, 0.2, 99.0, 99.0, 0.4)  # the observation positions' values are never read
    done = with_gae(sample, model_token_rewards(response, per_turn=True), values, gamma=0.9, lam=0.5)
    # model tokens 0, 1, 4: deltas 0 + .9 * .2 - .1 = .08, .25 + .9 * .4 - .2 = .41, .5 - .4 = .1; gl = .45
    a2 = 0.1
    a1 = 0.41 + 0.45 * a2
    a0 = 0.08 + 0.45 * a1
    assert approx(done.token_advantages, [a0, a1, 0.0, 0.0, a2])
    assert approx(done.values, [0.1, 0.2, 0.0, 0.0, 0.4])
    assert approx(done.returns, [a0 + 0.1, a1 + 0.2, 0.0, 0.0, a2 + 0.4])
    # whitened over the step's model tokens only: mean 0, std 1 there, environment tokens still 0
    other = with_gae(TrainSample((1,), (3,), 0.0), torch.tensor([1.0]), (0.0,), 1.0, 1.0)
    flat = [a for s in whitened([done, other]) for a, m in zip(s.token_advantages, s.response_mask or (True,))
            if m]
    assert sum(flat) == pytest.approx(0.0, abs=1e-9) and (sum(a * a for a in flat) / 4) == pytest.approx(1.0)
    assert whitened([done, other])[0].token_advantages[2:4] == (0.0, 0.0)


def test_a_per_token_advantage_equal_everywhere_is_the_per_response_one():
    """The losses take [B] or [B, T] advantages: the same number on every token gives the same loss and gradient."""
    samples = [TrainSample((1, 2), (3, 4, 5), 0.7), TrainSample((1,), (6, 7), -0.3)]
    per_token = [TrainSample(s.prompt_token_ids, s.response_token_ids, 0.0,
                             token_advantages=(s.advantage,) * s.num_response_tokens) for s in samples]
    results = []
    for batch_samples in (samples, per_token):
        batch = collate(batch_samples, pad_id=0)
        logprobs = torch.linspace(-2.0, -0.1, batch.input_ids.numel()).reshape(batch.input_ids.shape)
        logprobs.requires_grad_(True)
        loss, stats = ppo_clip_loss(logprobs, logprobs.detach() - 0.3, batch.advantages, batch.response_mask)
        loss.backward()
        results.append((float(loss.detach()), stats.clip_fraction, logprobs.grad.clone()))
    assert collate(per_token, 0).advantages.shape == (2, 5) and collate(samples, 0).advantages.shape == (2,)
    assert results[0][:2] == results[1][:2] and torch.equal(results[0][2], results[1][2])


def test_the_value_loss_clips_in_both_directions():
    old, clip = torch.tensor([[1.0, 1.0, 1.0, 1.0]]), 0.2
    returns = torch.tensor([[2.0, 2.0, 0.0, 2.0]])
    # token 0 moved up past the clip toward its return: the clipped error (1.2 - 2)^2 = .64 is larger, no gradient
    # token 1 moved down, away from its return: the unclipped (0.5 - 2)^2 = 2.25 is larger, full gradient
    # token 2 moved down past the clip toward a return below: the clipped (0.8)^2 = .64 is larger, no gradient
    # token 3 moved within the clip: both equal, not counted as clipped
    values = torch.tensor([[1.5, 0.5, 0.5, 1.1]], requires_grad=True)
    mask = torch.ones(1, 4)
    loss, stats = clipped_value_loss(values, old, returns, mask, clip)
    assert float(loss.detach()) == pytest.approx(0.5 * (0.64 + 2.25 + 0.64 + 0.81) / 4)
    assert stats.clip_fraction == pytest.approx(2 / 4) and stats.vpred_mean == pytest.approx(3.6 / 4)
    loss.backward()
    assert values.grad.tolist()[0] == pytest.approx([0.0, (0.5 - 2) / 4, 0.0, (1.1 - 2) / 4])
    # a masked token adds nothing; clip 0 is the plain squared error
    loss, _ = clipped_value_loss(values.detach(), old, returns, torch.tensor([[1.0, 0, 0, 0]]), clip=0.0,
                                 num_tokens_total=2)
    assert float(loss) == pytest.approx(0.5 * 0.25 / 2)


def test_explained_variance_reads_only_the_masked_tokens():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(returns, returns, mask) == 1.0
    assert explained_variance(torch.full((1, 5), 2.5), returns, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(returns, torch.ones(1, 5), mask))
