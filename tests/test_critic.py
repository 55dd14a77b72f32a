"""The critic (engines/train/critic.py), in process on a tiny Qwen2: it starts valuing every state 0, learns the
returns it is given, never learns from the environment's tokens, and checkpoints and loads exactly."""
from __future__ import annotations

import pytest
import torch

from tailflow.config import TrainConfig
from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.critic import CriticTrainer
from tailflow.engines.train.updates import Update


def critic(model_path: str, **changes) -> CriticTrainer:
    return CriticTrainer(model_path, TrainConfig(advantage="gae", lr=1e-2, num_workers=1, **changes))


def targets(samples: list[TrainSample], values: list[tuple[float, ...]], returns: float) -> list[TrainSample]:
    return [TrainSample(s.prompt_token_ids, s.response_token_ids, 0.0, response_mask=s.response_mask,
                        token_advantages=(0.0,) * s.num_response_tokens, values=v,
                        returns=(returns,) * s.num_response_tokens) for s, v in zip(samples, values)]


def one_update(samples: list[TrainSample]) -> list[Update]:
    tokens = sum(s.num_model_tokens for s in samples)
    return [Update(tuple(range(len(samples))), tokens, len(samples), tokens)]


def test_a_new_critic_values_everything_zero_and_learns_its_returns(model_path):
    trainer = critic(model_path)
    samples = [TrainSample((3, 4, 5), (6, 7, 8, 9), 0.0), TrainSample((3,), (10, 11), 0.0)]
    values = trainer.values(samples)
    assert [len(v) for v in values] == [4, 2] and all(x == 0.0 for v in values for x in v)
    losses = []
    for _ in range(5):
        stats = trainer.train_updates(targets(samples, trainer.values(samples), 1.0), one_update(samples))
        losses.append(stats.vf_loss)
    assert losses[0] == pytest.approx(0.5)  # 1/2 (0 - 1)^2 on every token
    assert losses[-1] < 0.5 * losses[0] and all(v > 0 for v in trainer.values(samples)[0])


def test_the_environments_tokens_teach_the_critic_nothing(model_path):
    """A value loss on a masked token would move the weights: with every model token already at its return and
    wild returns on the environment's tokens, the step has no gradient at all."""
    trainer = critic(model_path)
    sample = TrainSample((3, 4), (6, 7, 8, 9), 0.0, response_mask=(True, False, False, True))
    base = trainer.values([sample])[0]
    wild = TrainSample(sample.prompt_token_ids, sample.response_token_ids, 0.0, response_mask=sample.response_mask,
                       token_advantages=(0.0,) * 4, values=base, returns=(base[0], 50.0, -50.0, base[3]))
    before = {name: p.detach().clone() for name, p in trainer.value.module.named_parameters()}
    stats = trainer.train_updates([wild], one_update([wild]))
    assert stats.vf_loss == 0.0 and stats.grad_norm == 0.0
    assert all(torch.equal(before[name], p) for name, p in trainer.value.module.named_parameters())


def test_a_loaded_checkpoint_values_and_steps_as_the_critic_that_wrote_it(model_path):
    samples = [TrainSample((3, 4, 5), (6, 7, 8), 0.0)]
    first = critic(model_path)
    first.train_updates(targets(samples, first.values(samples), 2.0), one_update(samples))
    second = critic(model_path)
    second.load_checkpoint(first.state_for_checkpoint())
    assert second.values(samples) == first.values(samples)
    steps = [c.train_updates(targets(samples, c.values(samples), 2.0), one_update(samples)) for c in (first, second)]
    assert steps[0] == steps[1] and second.values(samples) == first.values(samples)


def test_an_offloaded_critic_comes_back_and_steps_as_one_that_stayed(model_path):
    """`offload` with the moves CUDA uses (`StagedMoves`, here with `copy=clone`, so every parameter and AdamW
    tensor really gets new storage each way): between steps the critic leaves and comes back, and values and
    steps bit for bit as a critic that never left."""
    from tailflow.engines.train.host_moves import StagedMoves

    samples = [TrainSample((3, 4, 5), (6, 7, 8), 0.0), TrainSample((3,), (9, 10, 11, 12), 0.0)]
    moved, stayed = critic(model_path), critic(model_path)
    moved.host_moves = StagedMoves(copy=torch.Tensor.clone)
    history = {id(moved): [], id(stayed): []}
    for step in range(3):
        for trainer in (moved, stayed):
            stats = trainer.train_updates(targets(samples, trainer.values(samples), 1.0 + step), one_update(samples))
            history[id(trainer)].append((stats, trainer.values(samples)))
        addresses = [p.data_ptr() for p in moved.value.module.parameters()]
        moved.offload()
        assert moved.is_offloaded
        assert all(p.data_ptr() != a for p, a in zip(moved.value.module.parameters(), addresses))
    assert history[id(moved)] == history[id(stayed)]
    assert moved.state_for_checkpoint()["model"].keys() == stayed.state_for_checkpoint()["model"].keys()
    assert not moved.is_offloaded
