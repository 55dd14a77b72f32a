"""train.ppo_epochs / train.mini_batches: the plan of optimizer updates, the proximal log-probs of the weights at
the start of the step (so the clip acts), and the one-update default left exactly as it was."""

import pytest
import torch

from random_samples import make_samples
from tailflow.config import ConfigError, TrainConfig, load_config
from tailflow.engines.cluster.trainer_group import TrainerGroup
from tailflow.engines.train.batch import TrainSample, count_response_tokens, shard_across_ranks
from tailflow.engines.train.trainer import PolicyTrainer
from tailflow.engines.train.updates import Update, equal_parts, plan_updates

torch.set_num_threads(1)


def response(length: int, advantage: float = 1.0) -> TrainSample:
    return TrainSample((5,), (6,) * length, advantage)


def weights_diff(a: PolicyTrainer, b: PolicyTrainer) -> float:
    wa, wb = a.full_state_dict(), b.full_state_dict()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


# ---- the plan -------------------------------------------------------------------------------------


def test_equal_parts_differ_by_at_most_one():
    assert equal_parts(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    assert equal_parts([1, 2], 2) == [[1], [2]]


def test_one_update_is_the_whole_batch():
    shards = [[response(1), response(2), response(3)], [response(4), response(5)]]
    plans = plan_updates(shards, [response(6, 0.0)])
    assert plans == [[Update((0, 1, 2), 21, 6, 15)], [Update((0, 1), 21, 6, 15)]]


def test_every_epoch_trains_each_sample_once_in_equal_mini_batches_counted_over_all_ranks():
    # rank 0 holds responses of 1, 2, 3 tokens, rank 1 of 4 and 5, and a 6-token response is skipped (A = 0)
    shards = [[response(1), response(2), response(3)], [response(4), response(5)]]
    skipped = [response(6, 0.0)]
    plans = plan_updates(shards, skipped, ppo_epochs=3, mini_batches=2, seed=7)
    assert [len(plan) for plan in plans] == [6, 6]  # the same number of collectives on both ranks
    compositions = set()
    for epoch in range(3):
        updates = range(2 * epoch, 2 * epoch + 2)
        for rank, shard in enumerate(shards):
            trained = sorted(i for u in updates for i in plans[rank][u].indices)
            assert trained == list(range(len(shard)))  # each of the rank's samples exactly once per epoch
        for u in updates:
            first, second = plans[0][u], plans[1][u]
            assert (first.num_tokens, first.num_sequences, first.num_metric_tokens) == \
                   (second.num_tokens, second.num_sequences, second.num_metric_tokens)  # global counts
            metric = sum(shards[0][i].num_response_tokens for i in first.indices) + \
                sum(shards[1][i].num_response_tokens for i in second.indices)
            assert first.num_metric_tokens == metric
            assert first.num_sequences == 3  # 6 samples in 2 equal mini-batches
            assert first.num_tokens - metric in (0, 6)  # the skipped response counts where it fell
        assert sum(plans[0][u].num_tokens for u in updates) == 21
        compositions.add(tuple(plans[0][u].indices for u in updates))
    assert len(compositions) > 1  # reshuffled per epoch
    assert plan_updates(shards, skipped, 3, 2, seed=7) == plans  # seeded: the same plan again
    with pytest.raises(ValueError, match="train.mini_batches \\(7\\) is more than the step's 6 samples"):
        plan_updates(shards, skipped, 1, 7)


def test_config_refuses_more_mini_batches_than_samples():
    with pytest.raises(ConfigError, match="train.mini_batches \\(9\\) must be <="):
        load_config(overrides=["data.prompts_per_step=2", "rollout.n=4", "train.mini_batches=9"])
    assert load_config(overrides=["train.ppo_epochs=2", "train.mini_batches=4"]).train.mini_batches == 4


# ---- single process -------------------------------------------------------------------------------


def test_one_update_takes_todays_step_bit_for_bit_and_skips_the_recompute(model_path, monkeypatch):
    """Defaults (1, 1): the plain step, no proximal pass; and the pass it skips would change nothing: forcing
    it gives the same weights to the last bit (the ratio is exactly 1)."""
    samples = make_samples(12, seed=1)
    num_tokens = count_response_tokens(samples)
    kwargs = dict(train=TrainConfig(lr=1e-3, kl_coef=0.1, max_tokens_per_micro_batch=64))
    plain, planned, forced = (PolicyTrainer(model_path, **kwargs) for _ in range(3))
    plain_stats = plain.train_step(samples, num_tokens)

    monkeypatch.setattr(planned, "_proximal_logprobs", lambda samples: pytest.fail("recomputed with one update"))
    planned_stats = planned.train_updates(samples, plan_updates([samples], [])[0], num_tokens)
    assert planned_stats == plain_stats and planned_stats.num_optimizer_steps == 1
    assert weights_diff(plain, planned) == 0.0

    proximal = forced._proximal_logprobs(samples)
    forced._backward(samples, num_tokens, num_tokens, proximal)
    forced._clip_and_step()
    assert weights_diff(plain, forced) == 0.0


def test_each_update_is_a_step_over_its_own_mini_batch_counts(model_path):
    """With a loss that has no proximal policy (tis), the updates are exactly successive steps, each on one
    mini-batch divided by that mini-batch's counts (its skipped zero-advantage samples included)."""
    samples = make_samples(10, seed=2, advantages=(-1.0, 0.0, 1.0))
    trained = [s for s in samples if s.advantage != 0.0]
    skipped = [s for s in samples if s.advantage == 0.0]
    assert trained and skipped
    kwargs = dict(train=TrainConfig(lr=1e-3, loss="tis", max_tokens_per_micro_batch=64))
    planned, stepped = PolicyTrainer(model_path, **kwargs), PolicyTrainer(model_path, **kwargs)
    updates = plan_updates([trained], skipped, ppo_epochs=2, mini_batches=2, seed=3)[0]
    stats = planned.train_updates(trained, updates, count_response_tokens(samples))
    for update in updates:
        assert update.num_tokens < count_response_tokens(samples)  # not the whole batch's count
        stepped.train_step([trained[i] for i in update.indices], update.num_tokens, update.num_sequences,
                           update.num_metric_tokens)
    assert weights_diff(planned, stepped) == 0.0
    assert stats.num_optimizer_steps == 4 and stats.num_samples == len(trained)


def test_later_updates_clip_against_the_weights_at_the_start_of_the_step(model_path, monkeypatch):
    samples = make_samples(16, seed=4)
    num_tokens = count_response_tokens(samples)
    updates = plan_updates([samples], [], ppo_epochs=2, mini_batches=2, seed=0)[0]
    one = PolicyTrainer(model_path, TrainConfig(lr=3e-2)).train_step(samples, num_tokens)
    assert one.clip_fraction == 0.0  # ratio 1: the clip never acts

    trainer = PolicyTrainer(model_path, TrainConfig(lr=3e-2))
    passes = []
    real = trainer._proximal_logprobs
    monkeypatch.setattr(trainer, "_proximal_logprobs", lambda s: passes.append(len(s)) or real(s))
    stats = trainer.train_updates(samples, updates, num_tokens)
    assert passes == [16]  # once, over the whole batch, before the first update
    assert stats.num_optimizer_steps == 4
    assert stats.clip_fraction > 0.0 and stats.approx_kl > 0.0  # later updates moved away from the start

    tis = PolicyTrainer(model_path, TrainConfig(lr=3e-2, loss="tis"))
    monkeypatch.setattr(tis, "_proximal_logprobs", lambda s: pytest.fail("tis never reads proximal log-probs"))
    assert tis.train_updates(samples, updates, num_tokens).num_optimizer_steps == 4


# ---- FSDP2 on Ray ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp_group_takes_the_same_updates_as_one_process(model_path, ray_cluster):
    """2 ranks, 2 epochs x 2 mini-batches with zero-advantage samples skipped == one process running the same
    plan over both ranks' samples (each update's mini-batch is the union of the ranks' shares).
    Costs ~15 s here (a TrainerGroup of two Ray FSDP actors taking 4 optimizer steps, then one in-process trainer
    replaying the same plan): two ranks are the fewest where each update's mini-batch is a union of ranks' shares,
    which is what it checks."""
    samples = make_samples(14, seed=5, advantages=(-1.0, 0.0, 1.0))
    kwargs = dict(train=TrainConfig(lr=1e-4, max_grad_norm=0.5, max_tokens_per_micro_batch=64))
    group = TrainerGroup(model_path, world_size=2, trainer_kwargs=kwargs)
    try:
        group_stats = group.train_step(samples, skip_zero_advantage=True, ppo_epochs=2, mini_batches=2, seed=1)
        weights = group.state_dict()
    finally:
        group.shutdown()

    trained = [s for s in samples if s.advantage != 0.0]
    shards = shard_across_ranks(trained, 2)
    plans = plan_updates(shards, [s for s in samples if s.advantage == 0.0], 2, 2, seed=1)
    merged = [Update(a.indices + tuple(len(shards[0]) + i for i in b.indices), a.num_tokens, a.num_sequences,
                     a.num_metric_tokens) for a, b in zip(*plans)]
    single = PolicyTrainer(model_path, **kwargs)
    single_stats = single.train_updates(shards[0] + shards[1], merged, count_response_tokens(samples))
    assert group_stats.num_optimizer_steps == 4 and group_stats.skipped_samples == len(samples) - len(trained)
    assert group_stats.grad_norm == pytest.approx(single_stats.grad_norm, rel=1e-5)
    assert group_stats.clip_fraction == pytest.approx(single_stats.clip_fraction, abs=1e-6)
    own = single.full_state_dict()
    assert max((weights[k] - own[k]).abs().max().item() for k in own) < 1e-5
