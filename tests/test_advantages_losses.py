"""Advantages and losses against numbers worked out by hand in the comments."""
import math

import pytest
import torch

from tailflow.engines.train.advantages import compute_advantages, grpo_advantages, rloo_advantages
from tailflow.engines.train.losses import entropy_from_logits, kl_penalty, ppo_clip_loss, token_logprobs


def test_grpo_uses_unbiased_std():
    # [1, 0, 0, 1]: mean .5, deviations +-.5, unbiased var = 4 * .25 / 3 = 1/3, std = .57735
    # [2, 0, 1]:    mean 1,  deviations 1, -1, 0, unbiased var = 2 / 2 = 1, std = 1
    got = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(got, torch.tensor([[a, -a, -a, a]]))
    got = grpo_advantages(torch.tensor([[2.0, 0.0, 1.0]]))
    torch.testing.assert_close(got, torch.tensor([[1.0, -1.0, 0.0]]) / (1 + 1e-6))


def test_grpo_equal_rewards_give_zero():
    assert grpo_advantages(torch.tensor([[1.0, 1.0, 1.0, 1.0]])).abs().max() == 0


def test_dr_grpo_only_centres():
    got = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]]), "dr_grpo")
    # group means .5 and 1
    torch.testing.assert_close(got, torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]))


def test_rloo_leave_one_out_baseline():
    # [1, 0, 0, 1]: A0 = 1 - (0+0+1)/3 = 2/3, A1 = 0 - (1+0+1)/3 = -2/3
    # [2, 0, 1]:    A0 = 2 - (0+1)/2 = 1.5, A1 = 0 - (2+1)/2 = -1.5, A2 = 1 - (2+0)/2 = 0
    torch.testing.assert_close(
        rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]])), torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]])
    )
    got = compute_advantages(torch.tensor([[2.0, 0.0, 1.0]]), "rloo")
    torch.testing.assert_close(got, torch.tensor([[1.5, -1.5, 0.0]]))


def test_compute_advantages_dispatch_and_errors():
    rewards = torch.tensor([[1.0, 0.0]])
    torch.testing.assert_close(compute_advantages(rewards, "grpo"), grpo_advantages(rewards))
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages(rewards, "ppo")
    with pytest.raises(ValueError, match="at least 2"):
        compute_advantages(torch.tensor([[1.0]]), "rloo")


def _ppo_case():
    # ratios r = [1.5, .5, 1.1, .7] in both rows (old logprobs 0), clip range [.8, 1.2]
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7], [1.5, 0.5, 1.1, 0.7]])
    logprobs = ratios.log().requires_grad_(True)
    old_logprobs = torch.zeros_like(ratios)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])  # rows of 4 and 3 tokens
    return logprobs, old_logprobs, advantages, mask


def test_ppo_clip_by_hand():
    logprobs, old_logprobs, advantages, mask = _ppo_case()
    loss, stats = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip_low=0.2, clip_high=0.2)
    # row A (A = +1): pg1 = -r = [-1.5, -.5, -1.1, -.7], pg2 = -clip(r) = [-1.2, -.8, -1.1, -.8]
    #   max = [-1.2, -.5, -1.1, -.7]; clipped term wins at token 0 only
    # row B (A = -1, 3 tokens): pg1 = r = [1.5, .5, 1.1], pg2 = [1.2, .8, 1.1]
    #   max = [1.5, .8, 1.1]; clipped term wins at token 1 only
    # token-level: (-1.2 - .5 - 1.1 - .7 + 1.5 + .8 + 1.1) / 7 = -0.1 / 7
    assert loss.item() == pytest.approx(-0.1 / 7, abs=1e-6)
    assert stats.pg_loss == pytest.approx(-0.1 / 7, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(2 / 7)
    # approx_kl per token = (r - 1) - log r
    k = [(r - 1) - math.log(r) for r in (1.5, 0.5, 1.1, 0.7)]
    assert stats.approx_kl == pytest.approx((sum(k) + k[0] + k[1] + k[2]) / 7, rel=1e-5)
    # gradient wrt logprobs (d ratio / d logprob = ratio): -A * r / 7 where unclipped, 0 where clipped or masked
    loss.backward()
    expected = torch.tensor([[0.0, -0.5, -1.1, -0.7], [1.5, 0.0, 1.1, 0.0]]) / 7
    torch.testing.assert_close(logprobs.grad, expected)


def test_ppo_asymmetric_clip_high():
    # DAPO clip-higher: with clip_high = .6, ratio 1.5 (A > 0) is no longer clipped
    logprobs, old_logprobs, advantages, mask = _ppo_case()
    loss, _ = ppo_clip_loss(logprobs[:1], old_logprobs[:1], advantages[:1], mask[:1], clip_low=0.2, clip_high=0.6)
    # max(-r, -clip(r, .8, 1.6)) = [-1.5, -.5, -1.1, -.7] -> mean over 4 tokens
    assert loss.item() == pytest.approx((-1.5 - 0.5 - 1.1 - 0.7) / 4, abs=1e-6)


def test_token_level_aggregation_across_micro_batches():
    logprobs, old_logprobs, advantages, mask = _ppo_case()
    full, _ = ppo_clip_loss(logprobs, old_logprobs, advantages, mask)
    # each row alone, both divided by the global 7 tokens, add up to the full-batch token mean
    row_a, _ = ppo_clip_loss(logprobs[:1], old_logprobs[:1], advantages[:1], mask[:1], num_tokens_total=7)
    row_b, _ = ppo_clip_loss(logprobs[1:], old_logprobs[1:], advantages[1:], mask[1:], num_tokens_total=7)
    assert (row_a + row_b).item() == pytest.approx(full.item(), abs=1e-7)
    # ... which is not the mean of per-sequence means: (-3.5/4 + 3.4/3) / 2
    assert full.item() != pytest.approx((-3.5 / 4 + 3.4 / 3) / 2, abs=1e-3)


def test_k3_kl_by_hand():
    # pi = [.5, .25], pi_ref = [.25, .5] on two tokens; log_r = ref - pi = [log .5, log 2]
    # k3 = r - log r - 1 = [.5 + log 2 - 1, 2 - log 2 - 1] -> sum = .5, mean over 2 tokens = .25
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5), -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert kl_penalty(logprobs, ref_logprobs, mask).item() == pytest.approx(0.25, abs=1e-6)
    assert kl_penalty(logprobs, ref_logprobs, mask, num_tokens_total=5).item() == pytest.approx(0.5 / 5, abs=1e-6)
    assert kl_penalty(ref_logprobs, ref_logprobs, mask).item() == 0.0


def test_entropy_by_hand():
    # position 0: uniform over 4 -> log 4; position 1: p = [1/4, 3/4] (logits 0, log 3, -inf-ish)
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -100.0, -100.0], [5.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits, mask).item() == pytest.approx((math.log(4) + h1) / 2, abs=1e-5)


def test_token_logprobs_align_with_next_token():
    # vocab 2; logits favour token 1 at position 0 with p = e / (1 + e)
    logits = torch.tensor([[[0.0, 1.0], [0.0, 0.0], [3.0, 3.0]]])
    input_ids = torch.tensor([[0, 1, 0]])
    got = token_logprobs(logits, input_ids)
    torch.testing.assert_close(got, torch.tensor([[math.log(math.e / (1 + math.e)), math.log(0.5), 0.0]]))
