"""Advantages and losses against numbers worked out by hand in the comments."""
import math

import pytest
import torch

from tailflow.engines.train.advantages import compute_advantages, grpo_advantages, rloo_advantages
from tailflow.config import TrainConfig
from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.losses import (
    LOSS_AGGREGATIONS,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    ppo_clip_loss,
    token_logprobs,
)


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


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("value", [0.1, 0.7, 2 / 3, 0.8])
def test_equal_rewards_that_float32_cannot_average_exactly_give_exactly_zero(estimator, value):
    """Eight equal rewards whose float32 mean is off by an ulp: GRPO's std division used to turn that ulp into
    a same-sign advantage of 0.007-0.056 for the whole group (issue 25, item 1)."""
    rewards = torch.tensor([[value] * 8, [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]])
    advantages = compute_advantages(rewards, estimator)
    assert advantages[0].tolist() == [0.0] * 8
    assert (advantages[1] != 0.0).all()  # a group with signal keeps it


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


# ---- loss aggregation (train.loss_agg) --------------------------------------------------------
# _ppo_case: per-token max terms summed per row: row A (4 tokens) -3.5, row B (3 tokens) 1.5 + .8 + 1.1 = 3.4;
# in total -0.1 over 7 tokens and 2 sequences.


def test_loss_denominators_by_hand():
    assert loss_denominator("token_mean", num_tokens=7, num_sequences=2) == 7
    assert loss_denominator("seq_mean_token_sum", num_tokens=7, num_sequences=2) == 2
    assert loss_denominator("constant", num_tokens=7, num_sequences=2, max_new_tokens=10) == 20
    assert loss_denominator("constant", num_tokens=3, num_sequences=2, max_new_tokens=10) == 20  # not the lengths


def test_loss_denominator_errors_name_the_choice():
    with pytest.raises(ValueError, match="unknown loss_agg 'seq_mean'"):
        loss_denominator("seq_mean", 7, 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        loss_denominator("constant", 7, 2)
    with pytest.raises(ValueError, match=">= 1 token"):
        loss_denominator("token_mean", 0, 2)


@pytest.mark.parametrize("loss_agg, expected_loss, denominator", [
    ("token_mean", -0.1 / 7, 7),
    ("seq_mean_token_sum", (-3.5 + 3.4) / 2, 2),  # the mean of the two rows' token sums
    ("constant", -0.1 / (2 * 10), 20),  # Dr. GRPO: 2 sequences x max_new_tokens 10
])
def test_ppo_loss_under_each_aggregation(loss_agg, expected_loss, denominator):
    logprobs, old_logprobs, advantages, mask = _ppo_case()
    divisor = loss_denominator(loss_agg, num_tokens=7, num_sequences=2, max_new_tokens=10)
    assert divisor == denominator
    loss, stats = ppo_clip_loss(logprobs, old_logprobs, advantages, mask, num_tokens_total=7,
                                loss_denominator=divisor)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert stats.pg_loss == pytest.approx(expected_loss, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(2 / 7)  # metrics stay token means under every aggregation
    loss.backward()
    # -A * r / divisor where unclipped, 0 where clipped or masked
    expected = torch.tensor([[0.0, -0.5, -1.1, -0.7], [1.5, 0.0, 1.1, 0.0]]) / denominator
    torch.testing.assert_close(logprobs.grad, expected)


def test_sequence_aggregation_adds_up_across_micro_batches():
    logprobs, old_logprobs, advantages, mask = _ppo_case()
    rows = [ppo_clip_loss(logprobs[i:i + 1], old_logprobs[i:i + 1], advantages[i:i + 1], mask[i:i + 1],
                          num_tokens_total=7, loss_denominator=2)[0] for i in (0, 1)]
    assert (rows[0] + rows[1]).item() == pytest.approx((-3.5 + 3.4) / 2, abs=1e-6)


def test_config_offers_exactly_the_aggregations_the_losses_know():
    assert TrainConfig.model_fields["loss_agg"].annotation.__args__ == LOSS_AGGREGATIONS
    assert TrainConfig().loss_agg == "token_mean"  # today's behaviour stays the default


@pytest.mark.parametrize("loss_agg, expected_pg_loss", [
    # first step: the recomputed old log-probs equal the new ones, so every ratio is 1 and nothing clips;
    # pg_loss = -sum_b A_b * len_b / divisor = -(1 * 2 + (-1) * 4) / divisor = 2 / divisor
    ("token_mean", 2 / 6),
    ("seq_mean_token_sum", 2 / 2),
    ("constant", 2 / (2 * 8)),
])
def test_trainer_divides_by_the_configured_aggregation(random_tiny_model_dir, loss_agg, expected_pg_loss):
    from tailflow.engines.train.trainer import PolicyTrainer

    samples = [TrainSample((5, 6), (7, 8), 1.0), TrainSample((5,), (9, 10, 11, 12), -1.0)]
    trainer = PolicyTrainer(str(random_tiny_model_dir), TrainConfig(lr=1e-3, loss_agg=loss_agg), max_new_tokens=8)
    stats = trainer.train_step(samples, num_tokens_total=6)
    assert stats.pg_loss == pytest.approx(expected_pg_loss, abs=1e-5)
    assert stats.clip_fraction == 0.0


def test_trainer_refuses_constant_aggregation_without_max_new_tokens(random_tiny_model_dir):
    from tailflow.engines.train.trainer import PolicyTrainer

    with pytest.raises(ValueError, match="max_new_tokens"):
        PolicyTrainer(str(random_tiny_model_dir), TrainConfig(loss_agg="constant"))


def test_k3_kl_by_hand():
    # pi = [.5, .25], pi_ref = [.25, .5] on two tokens; log_r = ref - pi = [log .5, log 2]
    # k3 = r - log r - 1 = [.5 + log 2 - 1, 2 - log 2 - 1] -> sum = .5, mean over 2 tokens = .25
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    ref_logprobs = torch.tensor([[math.log(0.25), math.log(0.5), -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert kl_penalty(logprobs, ref_logprobs, mask).item() == pytest.approx(0.25, abs=1e-6)
    assert kl_penalty(logprobs, ref_logprobs, mask, loss_denominator=5).item() == pytest.approx(0.5 / 5, abs=1e-6)
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


def test_run_config_reaches_the_trainer():
    from tailflow.config import load_config
    from tailflow.driver.workers import trainer_kwargs

    kwargs = trainer_kwargs(load_config(overrides=["train.loss_agg=constant", "rollout.max_new_tokens=64"]))
    assert (kwargs["train"].loss_agg, kwargs["max_new_tokens"]) == ("constant", 64)
    agentic = trainer_kwargs(load_config(overrides=[
        "train.loss_agg=constant", "rollout.max_new_tokens=64", "rollout.elastic=false",
        "env.class_path=tailflow.engines.env.builtin.calculator:Calculator", "env.trajectory_max_tokens=300"]))
    assert agentic["max_new_tokens"] == 300  # a trajectory may be longer than one response's cap
