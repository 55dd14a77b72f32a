"""Multi-turn samples on the trainer side: environment tokens are context, never trained.

Loss level (every `train.loss` through the trainer's own dispatch, every `train.loss_agg`, and the KL term):
the gradient at an environment token's logits is exactly zero and a model token's is not; an all-True mask is
bit for bit the unmasked sample. Trainer level (the tiny random Qwen2): the divisors count model tokens only,
the stats (entropy, clip fraction, approx KL, the rollout log-prob diff) skip environment tokens, what is in an
environment token's log-prob slot is never read while the token itself is read as context, and the streamed
step equals the whole one. The trajectory -> sample helper keeps `TRAINING_RULE`.
"""
from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from tailflow.config import TrainConfig
from tailflow.engines.env.trajectory import StopReason, Trajectory, Turn
from tailflow.engines.train.batch import TrainSample, collate, count_response_tokens, rollout_logprobs_matrix
from tailflow.engines.train.losses import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    token_logprobs,
)
from tailflow.engines.train.samples import sample_of_trajectory
from tailflow.engines.train.trainer import MicroBatchInputs, PolicyTrainer
from tailflow.engines.train.updates import plan_updates

torch.set_num_threads(1)

VOCAB = 22
"""The tiny random Qwen2's vocabulary (token ids 3.. are ordinary tokens)."""


def multi_turn_sample(rng: random.Random, advantage: float, turns: int = 3) -> TrainSample:
    """A random trajectory-shaped sample: per turn 1-4 action tokens, then 1-3 observation tokens (none after the
    last turn), the actions' rollout log-probs -3.0 and the observations' 0.0 (as `Trajectory` writes them)."""
    response, mask = [], []
    for turn in range(turns):
        num_action, num_observation = rng.randint(1, 4), rng.randint(1, 3) if turn < turns - 1 else 0
        response += [rng.randrange(3, VOCAB) for _ in range(num_action + num_observation)]
        mask += [True] * num_action + [False] * num_observation
    prompt = tuple(rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 5)))
    logprobs = tuple(-3.0 if is_model else 0.0 for is_model in mask)
    return TrainSample(prompt, tuple(response), advantage, logprobs, rollout_temperature=1.0,
                       response_mask=tuple(mask))


def multi_turn_batch(seed: int, count: int = 6) -> list[TrainSample]:
    rng = random.Random(seed)
    return [multi_turn_sample(rng, rng.choice((-1.0, 0.5, 1.0))) for _ in range(count)]


def environment_positions(samples: list[TrainSample], width: int) -> torch.Tensor:
    """[B, T] bool: the positions whose next token is an environment token."""
    found = torch.zeros((len(samples), width), dtype=torch.bool)
    for row, sample in enumerate(samples):
        found[row, sample.response_positions] = ~torch.tensor(sample.response_mask)
    return found


def loss_and_logit_grad(samples: list[TrainSample], loss: str, loss_agg: str, kl_coef: float = 0.0,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d logits [B, T, V]) of `train.loss` = `loss` as `PolicyTrainer._policy_loss` dispatches
    it, plus `kl_coef` * the KL penalty, on random logits; the proximal log-probs are the logits' own shifted by
    noise so every ratio, weight and clip is exercised."""
    batch = collate(samples, pad_id=0)
    generator = torch.Generator().manual_seed(seed)
    width = batch.input_ids.shape[1]
    logits = torch.randn((len(samples), width, VOCAB), generator=generator, requires_grad=True)
    logprobs = token_logprobs(logits, batch.input_ids)
    behaviour, present = rollout_logprobs_matrix(samples, width)
    proximal = logprobs.detach() + 0.3 * torch.randn(logprobs.shape, generator=generator)
    inputs = MicroBatchInputs(None, behaviour, present, proximal)
    train = TrainConfig(loss=loss, loss_agg=loss_agg)
    denominator = loss_denominator(loss_agg, count_response_tokens(samples), len(samples), max_new_tokens=16)
    trainer = SimpleNamespace(train=train)  # the dispatch reads nothing else of the trainer
    value, _ = PolicyTrainer._policy_loss(trainer, logprobs, batch, inputs, count_response_tokens(samples),
                                          denominator)
    if kl_coef:
        reference = logprobs.detach() + torch.randn(logprobs.shape, generator=generator)
        value = value + kl_coef * kl_penalty(logprobs, reference, batch.response_mask, denominator)
    value.backward()
    return value.detach(), logits.grad


# ---- the sample ------------------------------------------------------------------------------------


def test_mask_is_validated():
    with pytest.raises(ValueError, match="response_mask has 2 flags for 3 response tokens"):
        TrainSample((1,), (2, 3, 4), 1.0, response_mask=(True, False))
    with pytest.raises(ValueError, match="marks no model token"):
        TrainSample((1,), (2, 3), 1.0, response_mask=(False, False))
    sample = TrainSample((1,), (2, 3, 4), 1.0, response_mask=(True, False, True))
    assert (sample.num_response_tokens, sample.num_model_tokens, count_response_tokens([sample])) == (3, 2, 2)


def test_collate_keeps_environment_tokens_in_the_input_and_out_of_the_mask():
    sample = TrainSample((5, 6), (7, 8, 9, 10), 1.0, (-1.0, 0.0, 0.0, -2.0), response_mask=(True, False, False, True))
    batch = collate([sample], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert batch.response_mask.tolist() == [[0, 1, 0, 0, 1, 0]]  # position t predicts token t+1
    values, present = rollout_logprobs_matrix([sample], 6)
    assert present.tolist() == [[0, 1, 0, 0, 1, 0]]  # an observation has no behaviour log-prob to compare


# ---- the losses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("loss", POLICY_LOSSES)
def test_environment_logits_get_exactly_zero_gradient(loss, loss_agg, kl_coef):
    """Without KL a clipped model token has no gradient either (the clip's own rule), so only "some" is asked
    of the model tokens; with KL every one of them has one."""
    samples = multi_turn_batch(seed=1)
    _, grad = loss_and_logit_grad(samples, loss, loss_agg, kl_coef)
    batch = collate(samples, pad_id=0)
    environment = environment_positions(samples, batch.input_ids.shape[1])
    assert environment.sum() > 0
    assert torch.equal(grad[environment], torch.zeros_like(grad[environment]))
    model_token_has_grad = grad[batch.response_mask.bool()].abs().sum(dim=-1) > 0
    assert model_token_has_grad.all() if kl_coef else model_token_has_grad.sum() >= model_token_has_grad.numel() // 2


@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("loss", POLICY_LOSSES)
def test_all_true_mask_is_bit_for_bit_the_unmasked_sample(loss, loss_agg):
    unmasked = [TrainSample(s.prompt_token_ids, s.response_token_ids, s.advantage,
                            tuple(-3.0 for _ in s.response_token_ids), rollout_temperature=1.0)
                for s in multi_turn_batch(seed=2)]
    all_true = [replace(s, response_mask=(True,) * s.num_response_tokens) for s in unmasked]
    assert all(torch.equal(a, b) for a, b in zip(collate(unmasked, 0), collate(all_true, 0)))
    loss_none, grad_none = loss_and_logit_grad(unmasked, loss, loss_agg, kl_coef=0.5)
    loss_true, grad_true = loss_and_logit_grad(all_true, loss, loss_agg, kl_coef=0.5)
    assert torch.equal(loss_none, loss_true) and torch.equal(grad_none, grad_true)


def test_kl_and_entropy_average_over_model_tokens_only():
    """Environment positions get a huge KL and entropy; the means must not see them."""
    samples = multi_turn_batch(seed=3)
    batch = collate(samples, pad_id=0)
    width = batch.input_ids.shape[1]
    environment = environment_positions(samples, width)
    model = batch.response_mask.bool()
    logits = torch.randn((len(samples), width, VOCAB), generator=torch.Generator().manual_seed(3))
    logprobs = token_logprobs(logits, batch.input_ids)
    reference = logprobs + torch.where(environment, 15.0, 0.1)
    log_ratio = reference - logprobs
    k3 = torch.exp(log_ratio) - log_ratio - 1.0
    kl = kl_penalty(logprobs, reference, batch.response_mask, count_response_tokens(samples))
    torch.testing.assert_close(kl, k3[model].mean())
    assert k3[environment].mean() > 1e5 * k3[model].mean()  # counting them would show
    peaked = logits.clone()
    peaked[~environment] *= 20.0  # model positions nearly deterministic, environment ones spread out
    entropy = entropy_from_logits(peaked, batch.response_mask, count_response_tokens(samples))
    token_entropy = -(torch.softmax(peaked, -1) * torch.log_softmax(peaked, -1)).sum(-1)
    torch.testing.assert_close(entropy, token_entropy[model].mean())
    assert token_entropy[environment].mean() > 10 * token_entropy[model].mean()


# ---- the trainer -----------------------------------------------------------------------------------


def hand_made_batch() -> list[TrainSample]:
    """4 model tokens around 3 environment tokens (advantage 1), then 2 model tokens (advantage 0.5)."""
    first = TrainSample((5, 6, 7), (8, 9, 10, 11, 12, 13, 14), 1.0, (-3.0, -3.0, 0.0, 0.0, 0.0, -3.0, -3.0), 0.0,
                        1.0, response_mask=(True, False, False, False, True, True, True))
    second = TrainSample((5, 6), (15, 16), 0.5, (-3.0, -3.0), 0.0, 1.0)
    return [first, second]


@pytest.mark.parametrize("loss_agg, expected", [
    ("token_mean", -(4 * 1.0 + 2 * 0.5) / 6),         # environment tokens counted: -8 / 9 (or -5 / 9 in the divisor)
    ("seq_mean_token_sum", -(4 * 1.0 + 2 * 0.5) / 2),  # environment tokens summed: -8 / 2
    ("constant", -(4 * 1.0 + 2 * 0.5) / (2 * 16)),     # environment tokens summed: -8 / 32
])
def test_loss_divides_by_model_tokens_only(model_path, loss_agg, expected):
    """ppo_clip with one optimizer step has ratio 1: the loss is -sum(A over trained tokens) / denominator."""
    samples = hand_made_batch()
    trainer = PolicyTrainer(model_path, TrainConfig(loss_agg=loss_agg), max_new_tokens=16)
    stats = trainer.train_step(samples, count_response_tokens(samples), len(samples))
    assert stats.num_tokens == 6
    assert stats.pg_loss == pytest.approx(expected, rel=1e-6)


def model_logits(trainer: PolicyTrainer, sample: TrainSample) -> torch.Tensor:
    batch = collate([sample], pad_id=trainer.pad_id)
    with torch.no_grad():
        return trainer.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()


def test_step_stats_skip_environment_tokens(model_path):
    """The rollout log-probs of the model tokens are set to the trainer's own: ratio 1 there, so clip fraction,
    approx KL and the rollout diff are ~0 over model tokens. The environment slots hold 0.0, far from the
    model's log-probs (~-3): read, they would clip (ppo_behaviour) and show in every one of them."""
    trainer = PolicyTrainer(model_path, TrainConfig(loss="ppo_behaviour", lr=1e-9))
    samples = []
    for sample in hand_made_batch():
        batch = collate([sample], pad_id=trainer.pad_id)
        own = token_logprobs(model_logits(trainer, sample), batch.input_ids)[0, sample.response_positions]
        mask = sample.response_mask or (True,) * sample.num_response_tokens
        samples.append(replace(sample, rollout_logprobs=tuple(x if m else 0.0 for x, m in zip(own.tolist(), mask))))
    expected_entropy = []
    for sample in samples:
        logits = model_logits(trainer, sample)[0, sample.response_positions]
        token_entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
        expected_entropy += [h for h, m in zip(token_entropy.tolist(), sample.response_mask or [True] * 2) if m]
    stats = trainer.train_step(samples, count_response_tokens(samples), len(samples))
    assert stats.clip_fraction == 0.0
    assert abs(stats.approx_kl) < 1e-6 and stats.logprob_diff_vs_rollout < 1e-5
    assert stats.entropy == pytest.approx(sum(expected_entropy) / len(expected_entropy), rel=1e-5)


@pytest.mark.parametrize("loss, ppo_epochs", [("tis", 1), ("decoupled_ppo", 2)])
def test_environment_tokens_are_context_but_their_log_prob_slots_are_never_read(model_path, loss, ppo_epochs):
    """Both losses read the behaviour log-probs (decoupled_ppo over 2 updates also the proximal pass): garbage in
    an observation's slot must change nothing (bit for bit), while other observation TOKENS must change the
    step (the later actions are predicted from them)."""
    base = multi_turn_batch(seed=4)

    def weights_after(samples):
        trainer = PolicyTrainer(model_path, TrainConfig(loss=loss, lr=1e-3))
        trainer.train_updates(samples, plan_updates([samples], [], ppo_epochs)[0], count_response_tokens(samples))
        return trainer.full_state_dict()

    garbage = [replace(s, rollout_logprobs=tuple(x if m else -50.0 for x, m in zip(s.rollout_logprobs,
                                                                                 s.response_mask)))
               for s in base]
    other_observations = [replace(s, response_token_ids=tuple(t if m else 3 + (t - 2) % (VOCAB - 3) for t, m in
                                                              zip(s.response_token_ids, s.response_mask)))
                          for s in base]
    reference = weights_after(base)
    assert all(torch.equal(reference[k], v) for k, v in weights_after(garbage).items())
    changed = weights_after(other_observations)
    assert max((reference[k] - v).abs().max().item() for k, v in changed.items()) > 1e-6


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_sum"])
def test_streamed_masked_pieces_equal_the_whole_step(model_path, loss_agg):
    """As test_stream_trainer's check (same tolerances), on multi-turn samples."""
    kwargs = dict(train=TrainConfig(lr=1e-5, kl_coef=0.1, loss_agg=loss_agg, max_tokens_per_micro_batch=64))
    whole, streamed = PolicyTrainer(model_path, **kwargs), PolicyTrainer(model_path, **kwargs)
    samples = multi_turn_batch(seed=5, count=8)
    whole_stats = whole.train_step(samples, count_response_tokens(samples), len(samples))
    for piece in (samples[:1], samples[1:5], samples[5:]):
        streamed.accumulate(piece)
    stats = streamed.finish_step(count_response_tokens(samples), len(samples))
    assert stats.grad_norm == pytest.approx(whole_stats.grad_norm, rel=1e-6)
    for name in ("pg_loss", "kl", "entropy", "approx_kl", "clip_fraction", "logprob_diff_vs_rollout"):
        assert getattr(stats, name) == pytest.approx(getattr(whole_stats, name), rel=1e-5, abs=1e-7), name
    assert stats.num_tokens == whole_stats.num_tokens == sum(sum(s.response_mask) for s in samples)
    whole_weights, streamed_weights = whole.full_state_dict(), streamed.full_state_dict()
    assert max((whole_weights[k] - v).abs().max().item() for k, v in streamed_weights.items()) < 1e-6


@pytest.mark.slow
def test_megatron_matches_fsdp2_on_multi_turn_samples():
    """test_megatron_alignment's check (its tolerances, 3 steps, decoupled_ppo: the loss reads the model's
    log-probs) on multi-turn batches, Megatron TP=2 against FSDP2 on 2 ranks: the mask reaches both backends
    through the same collate and losses. Costs ~10 s here: two gloo rank processes, each importing torch and
    megatron-core (~4 s of it), then 3 steps per backend; two ranks are the fewest where tensor parallelism
    splits the logits' computation."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    from importlib import resources

    from megatron_ranks import aligned_steps, run_gloo_ranks
    from test_megatron_alignment import KWARGS, misalignments

    warmstart_dir = str(resources.files("tailflow") / "assets" / "warmstart")
    batches = [multi_turn_batch(seed, count=12) for seed in (101, 102, 103)]
    runs = run_gloo_ranks(aligned_steps, 2, warmstart_dir, dict(KWARGS, loss="decoupled_ppo"), batches,
                          ("fsdp2", "megatron_tp2"))
    assert all(step["grad_norm"] > 0 for step in runs["fsdp2"]["steps"])
    assert misalignments(runs["fsdp2"], runs["megatron_tp2"], KWARGS["lr"]) == []


# ---- trajectory -> sample --------------------------------------------------------------------------


def trajectory(stop_reason: StopReason) -> Trajectory:
    turns = (Turn((10, 11), (-0.5, -0.25), (3, 3), (20, 21, 22), reward=0.0),
             Turn((12,), (-1.5,), (3,), (), reward=1.0))
    return Trajectory("p1", 0, 7, (1, 2, 3), turns, stop_reason)


def test_sample_of_trajectory_masks_observations_and_refuses_dropped():
    sample = sample_of_trajectory(trajectory(StopReason.DONE), advantage=0.75, temperature=0.9)
    assert sample.prompt_token_ids == (1, 2, 3)
    assert sample.response_token_ids == (10, 11, 20, 21, 22, 12)
    assert sample.response_mask == (True, True, False, False, False, True)
    assert sample.rollout_logprobs == (-0.5, -0.25, 0.0, 0.0, 0.0, -1.5)
    assert (sample.advantage, sample.reward, sample.rollout_temperature) == (0.75, 1.0, 0.9)
    assert sample.num_model_tokens == 3
    for dropped in (StopReason.ENV_ERROR, StopReason.TIMEOUT, StopReason.ABORT):
        with pytest.raises(ValueError, match=f"stopped by {dropped.value}.*drops"):
            sample_of_trajectory(trajectory(dropped), advantage=0.75, temperature=0.9)
