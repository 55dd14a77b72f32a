"""The off-policy losses against numbers worked out by hand, and the trainer's choice among them.

One response of two tokens: the trainer's log-probs (-1, -2), the rollout engine's (behaviour) log-probs
(-1.5, -1), advantage 2, token_mean over 2 tokens. So r = pi / mu = (e^0.5, e^-1) = (1.6487, 0.3679).
"""
from __future__ import annotations

import math

import pytest
import torch

from tailflow.config import OFF_POLICY_LOSSES, ConfigError, TrainConfig, load_config
from tailflow.engines.train.losses import (LOSSES, POLICY_LOSSES, PROXIMAL_LOSSES, cispo_loss, decoupled_ppo_loss,
                                           ppo_clip_loss, tis_loss, topr_loss)

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


def test_topr_is_plain_policy_gradient_for_positive_advantages_and_tis_otherwise():
    positive = loss_and_grad(lambda lp: topr_loss(lp, BEHAVIOUR, ADVANTAGE, MASK))
    assert positive[0] == pytest.approx(3.0) and positive[1] == pytest.approx([-1.0, -1.0])
    negative = loss_and_grad(lambda lp: topr_loss(lp, BEHAVIOUR, -ADVANTAGE, MASK))
    tis = loss_and_grad(lambda lp: tis_loss(lp, BEHAVIOUR, -ADVANTAGE, MASK))
    # weights (1, R2) as in TIS, the sign flipped: loss = -(1 * -2 * -1 + R2 * -2 * -2) / 2, grad = +w * 2 / 2
    assert negative[0] == pytest.approx(tis[0]) and negative[1] == pytest.approx(tis[1])
    assert negative[0] == pytest.approx(-(2 + 4 * R2) / 2, rel=1e-6)
    assert negative[1] == pytest.approx([1.0, R2], rel=1e-6)


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
    """The table of losses (losses.LOSSES) is the one list; config.py, which imports nothing of engines/, spells
    its names and its off-policy ones again: adding or changing a loss fails here until both agree."""
    assert TrainConfig.model_fields["loss"].annotation.__args__ == tuple(LOSSES) == POLICY_LOSSES
    assert OFF_POLICY_LOSSES == tuple(name for name, spec in LOSSES.items() if spec.off_policy)
    assert set(OFF_POLICY_LOSSES) < set(POLICY_LOSSES)
    assert PROXIMAL_LOSSES == ("ppo_clip", "decoupled_ppo")  # the ones the trainer computes proximal log-probs for


def test_truncated_sampling_needs_an_importance_correction():
    with pytest.raises(ConfigError, match="top_p 0.9.*importance-corrected train.loss"):
        load_config(None, ["rollout.top_p=0.9"])
    assert load_config(None, ["rollout.top_p=0.9", "train.loss=tis"]).train.loss == "tis"
    # the engine records the log-probs of the tempered, filtered distribution: every loss takes any temperature
    for loss in POLICY_LOSSES:
        assert load_config(None, ["rollout.temperature=0.7", f"train.loss={loss}"]).rollout.temperature == 0.7
    assert load_config(None, ["rollout.temperature=1.3", "rollout.top_k=5", "train.loss=cispo"]).rollout.top_k == 5


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
                                   reward=float(index == 0), rollout_temperature=1.0))
    return samples


def weights_after(model_path: str, samples, trained, loss: str = "ppo_clip"):
    from tailflow.engines.train.batch import count_response_tokens
    from tailflow.engines.train.trainer import PolicyTrainer

    trainer = PolicyTrainer(model_path, TrainConfig(lr=1e-3, loss=loss, max_tokens_per_micro_batch=24))
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
    # The micro-batches differ (the skipped samples are not packed), so sums run in another order; AdamW's first
    # step, lr * g / (|g| + eps), turns that rounding into up to ~1e-5 on weights whose gradient is near eps
    # (seen with transformers 5.24). A change in the gradient itself moves weights by about lr (1e-3).
    assert max((full[k] - skipped[k]).abs().max().item() for k in full) < 1e-4
    assert max((full[k] - weights_after(str(random_tiny_model_dir), samples, samples[:2])[0][k]).abs().max().item()
               for k in full) > 1e-3  # leaving out a sample WITH signal does change the step
    assert stats.num_samples == 3
    assert stats.num_tokens == count_response_tokens(samples)  # the loss denominator is the whole batch's



def test_topr_chooses_its_positive_set_by_the_advantage_not_the_reward(random_tiny_model_dir):
    """Every reward positive (partial credit), advantages of both signs (issue 25, item 2): TOPR must truncate
    the below-baseline responses as TIS does (its rollout log-probs -2.5 put r = pi / mu near 0.55 on this
    model, so weight 1 would differ), and give the above-baseline ones plain policy gradient (ppo_clip's
    gradient with one optimizer step)."""
    from dataclasses import replace

    torch.set_num_threads(1)
    model_dir = str(random_tiny_model_dir)
    samples = [replace(sample, reward=0.5) for sample in samples_with_zero_advantage_groups()]
    below = [replace(sample, advantage=-1.0) for sample in samples]
    above = [replace(sample, advantage=1.0) for sample in samples]

    def distance(a, b):
        return max((a[k] - b[k]).abs().max().item() for k in a)

    assert distance(weights_after(model_dir, below, below, "topr")[0], weights_after(model_dir, below, below, "tis")[0]) < 1e-6
    assert distance(weights_after(model_dir, above, above, "topr")[0],
                    weights_after(model_dir, above, above, "ppo_clip")[0]) < 1e-6
    assert distance(weights_after(model_dir, below, below, "topr")[0],
                    weights_after(model_dir, below, below, "ppo_clip")[0]) > 1e-6  # truncation did change the step


@pytest.mark.parametrize("loss", POLICY_LOSSES)
def test_every_loss_trains_through_the_trainer(random_tiny_model_dir, loss):
    torch.set_num_threads(1)
    samples = samples_with_zero_advantage_groups()
    _, stats = weights_after(str(random_tiny_model_dir), samples, samples, loss)
    assert math.isfinite(stats.pg_loss) and math.isfinite(stats.grad_norm) and stats.grad_norm > 0
    assert stats.logprob_diff_vs_rollout is not None


# ---- behaviour log-probs of the distribution that sampled (issue 25, items 3 and 4) -------------------------

def rolled_out_samples(model_dir: str, temperature: float, top_p: float = 1.0, top_k: int = 0):
    """Responses the native engine sampled from the tiny model, as TrainSamples carrying its log-probs."""
    from tailflow.engines.rollout.native import NativeEngine
    from tailflow.engines.rollout.protocol import Request, SamplingParams
    from tailflow.engines.train.batch import TrainSample

    engine = NativeEngine.from_pretrained(model_dir, num_slots=4, max_seq_len=40, seed=5, eos_token_ids=())
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=12)
    prompts = [(3, 4, 5), (7, 8, 9, 10), (11, 3), (12, 13, 14, 15, 16)]
    completions = engine.generate([Request(f"r{i}", prompt, params) for i, prompt in enumerate(prompts)])
    return [TrainSample(c.prompt_token_ids, c.token_ids, 1.0 - 0.5 * i, c.logprobs, rollout_temperature=temperature)
            for i, c in enumerate(sorted(completions, key=lambda c: c.request_id))]


def step_stats(model_dir: str, samples, loss: str, temperature: float):
    from tailflow.engines.train.batch import count_response_tokens
    from tailflow.engines.train.trainer import PolicyTrainer

    trainer = PolicyTrainer(model_dir, TrainConfig(lr=1e-3, loss=loss), temperature=temperature)
    return trainer.train_step(samples, count_response_tokens(samples))


@pytest.mark.parametrize("loss", ["ppo_clip", "tis"])
def test_trainer_and_engine_log_probs_agree_at_the_sampling_temperature(random_tiny_model_dir, loss):
    """Same weights, T = 0.7: the engine's recorded log-probs (the tempered distribution that drew each token)
    equal the trainer's softmax(logits / T) to float precision, so the importance weight pi / mu is 1 and
    actor/logprob_diff_vs_rollout is ~0 (0.097 on this model while the engine recorded the temperature-1 log-prob)."""
    torch.set_num_threads(1)
    samples = rolled_out_samples(str(random_tiny_model_dir), temperature=0.7)
    stats = step_stats(str(random_tiny_model_dir), samples, loss, temperature=0.7)
    assert stats.logprob_diff_vs_rollout < 1e-4
    assert stats.approx_kl < 1e-8  # tis: k3 of pi / mu, ~0 where the two distributions agree


def test_with_top_p_the_diff_is_the_log_of_the_mass_the_filter_kept(random_tiny_model_dir):
    """With top_p the engine's mu is renormalised over the tokens kept, the trainer's pi is not: per token,
    log pi - log mu = log(mass kept at that step), so the metric is the mean of -log(mass kept)."""
    from engine_contract import sampling_logprobs
    from tailflow.engines.models import load_model
    from tailflow.engines.rollout.protocol import SamplingParams

    torch.set_num_threads(1)
    model_dir = str(random_tiny_model_dir)
    samples = rolled_out_samples(model_dir, temperature=1.3, top_p=0.6)
    model = load_model(model_dir).eval()
    kept_mass_logs = []
    for sample in samples:
        ids = torch.tensor([sample.prompt_token_ids + sample.response_token_ids])
        start = len(sample.prompt_token_ids) - 1
        with torch.no_grad():
            logits = model(ids).logits[0, start:start + sample.num_response_tokens].float()
        tokens = torch.tensor(sample.response_token_ids)[:, None]
        pi = torch.log_softmax(logits / 1.3, dim=-1).gather(1, tokens)[:, 0]
        mu = sampling_logprobs(logits, SamplingParams(temperature=1.3, top_p=0.6)).gather(1, tokens)[:, 0]
        torch.testing.assert_close(torch.tensor(sample.rollout_logprobs), mu.float(), atol=1e-4, rtol=0)
        kept_mass_logs.append(pi.double() - mu)
    expected = torch.cat(kept_mass_logs).abs().mean().item()
    assert expected > 0.05  # the filter cut real mass: the comparison says something
    stats = step_stats(model_dir, samples, "cispo", temperature=1.3)
    assert stats.logprob_diff_vs_rollout == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("sampled_at", [0.7, None])
def test_an_off_policy_loss_refuses_log_probs_of_another_temperature(random_tiny_model_dir, sampled_at):
    """A trainer built without the sampling temperature (1.0) would weigh by pi_1 / mu_0.7: refused before any
    gradient, naming both temperatures; ppo_clip, which never reads them, trains and leaves them out of the
    like-with-like metric."""
    from dataclasses import replace

    from tailflow.engines.train.trainer import PolicyTrainer

    torch.set_num_threads(1)
    model_dir = str(random_tiny_model_dir)
    samples = [replace(s, rollout_temperature=sampled_at) for s in rolled_out_samples(model_dir, temperature=0.7)]
    trainer = PolicyTrainer(model_dir, TrainConfig(lr=1e-3, loss="decoupled_ppo"))
    before = trainer.full_state_dict()
    with pytest.raises(ValueError, match=rf"trainer's temperature 1.0, but samples were sampled at temperature "
                                         rf"\[{sampled_at}\]"):
        trainer.train_step(samples, sum(s.num_response_tokens for s in samples))
    after = trainer.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and not trainer.optimizer.state
    assert step_stats(model_dir, samples, "ppo_clip", temperature=1.0).logprob_diff_vs_rollout is None
