"""Offloading the trainer while a colocated rollout engine has the GPU (`PolicyTrainer.offload`, `TrainerWorker.park`).

This machine has no GPU: the trainer's device is host memory, so `offload` moves nothing and these tests check
what can be checked here: the bookkeeping (`is_offloaded`, the refusal during a streamed step, the state coming
back before every use) and that an offloaded trainer loses nothing (bit-for-bit the same run). The CUDA move
itself has not run here. Single process, world_size 1, no Ray.
"""

import pytest
import torch

from random_samples import make_samples
from tailflow.config import TrainConfig
from tailflow.engines.train.batch import count_response_tokens
from tailflow.engines.train.host_moves import StagedMoves
from tailflow.engines.train.trainer import PolicyTrainer, TrainStepStats
from tailflow.engines.train.updates import plan_updates
from tailflow.engines.train.worker import TrainerWorker

torch.set_num_threads(1)

KWARGS = dict(train=TrainConfig(lr=1e-3, kl_coef=0.1, max_tokens_per_micro_batch=64, seed=3))
"""kl_coef > 0: the reference model is loaded, and offloaded with the policy."""


def assert_identical(a, b) -> None:
    """Nested dicts / lists of tensors and plain values: the same keys, every tensor torch.equal (dtype too)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(map(str, a)) == sorted(map(str, b))
        for key in a:
            assert_identical(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_identical(x, y)
    else:
        assert a == b


def three_steps(trainer: PolicyTrainer, offload_before_each: bool) -> list[TrainStepStats]:
    """A plain step, a step of two updates (proximal log-probs first), a streamed step in two pieces."""
    batches = [make_samples(8, seed) for seed in (11, 12, 13)]
    kinds = [
        lambda s: trainer.train_step(s, count_response_tokens(s)),
        lambda s: trainer.train_updates(s, plan_updates([s], [], ppo_epochs=2)[0], count_response_tokens(s)),
        lambda s: (trainer.accumulate(s[:3]), trainer.accumulate(s[3:]),
                   trainer.finish_step(count_response_tokens(s), len(s)))[-1],
    ]
    stats = []
    for run, samples in zip(kinds, batches):
        if offload_before_each:
            trainer.offload()
            assert trainer.is_offloaded
        stats.append(run(samples))
        assert not trainer.is_offloaded
    return stats


def test_offloading_between_steps_changes_nothing(model_path):
    offloaded, resident = PolicyTrainer(model_path, **KWARGS), PolicyTrainer(model_path, **KWARGS)
    offloaded_stats, resident_stats = three_steps(offloaded, True), three_steps(resident, False)
    assert offloaded_stats == resident_stats
    assert resident_stats[-1].kl > 0  # the reference model took part in every step
    offloaded.offload()  # the state is read back from an offloaded trainer too
    assert_identical(offloaded.full_state_dict(), resident.full_state_dict())
    offloaded.offload()
    assert_identical(offloaded.state_for_checkpoint(), resident.state_for_checkpoint())
    assert_identical(offloaded.ref_model.state_dict(), resident.ref_model.state_dict())


def test_park_returns_the_checkpoint_state_and_leaves_the_trainer_offloaded(model_path, monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")  # undone after the test: the worker writes its rank's environment
    worker = TrainerWorker(model_path, 0, 1, 1, KWARGS)
    worker.connect("127.0.0.1", 29500)
    model_state, optimizer_state, shard = worker.park()
    assert optimizer_state is None and shard is None and worker.trainer.is_offloaded  # before any step Adam has no state
    samples = make_samples(8, seed=21)
    worker.train_updates(samples, plan_updates([samples], [])[0], count_response_tokens(samples))
    assert not worker.trainer.is_offloaded

    expected = worker.state_for_checkpoint()
    model_state, optimizer_state, _ = worker.park()
    assert worker.trainer.is_offloaded
    assert_identical(model_state, expected.model)
    assert_identical(optimizer_state, expected.optimizer)
    stats = worker.train_updates(samples, plan_updates([samples], [])[0], count_response_tokens(samples))
    assert not worker.trainer.is_offloaded and stats.grad_norm > 0
    after = worker.full_state_dict()
    assert any(not torch.equal(after[name], model_state[name]) for name in after)  # it trained
    worker.offload()
    assert worker.trainer.is_offloaded


def test_offload_is_refused_while_a_streamed_step_is_open(model_path):
    trainer = PolicyTrainer(model_path, **KWARGS)
    samples = make_samples(6, seed=31)
    trainer.accumulate(samples)
    with pytest.raises(RuntimeError, match="streamed step is open"):
        trainer.offload()
    assert not trainer.is_offloaded
    trainer.finish_step(count_response_tokens(samples), len(samples))
    trainer.offload()
    assert trainer.is_offloaded


def test_after_offload_every_weight_and_optimizer_tensor_is_in_host_memory(model_path):
    """On this CPU-only machine these tensors never leave host memory, so the device checks hold trivially:
    they state the contract a CUDA run must meet, not evidence that the move works. What the test does check
    here: gradients dropped, the flag set, offload idempotent, the optimizer still keyed by the model's own
    parameter objects, and the first use after it (full_state_dict) bringing the state back."""
    trainer = PolicyTrainer(model_path, **KWARGS)
    samples = make_samples(8, seed=41)
    trainer.train_step(samples, count_response_tokens(samples))
    trainer.offload()
    trainer.offload()
    assert trainer.is_offloaded
    for parameter in [*trainer.model.parameters(), *trainer.ref_model.parameters()]:
        assert parameter.device.type == "cpu" and parameter.grad is None
    state = trainer.optimizer.state
    assert {id(p) for p in state} == {id(p) for p in trainer.model.parameters()}
    tensors = [value for entry in state.values() for key, value in entry.items() if key != "step"]
    assert len(tensors) == 2 * len(state) and all(t.device.type == "cpu" for t in tensors)
    trainer.full_state_dict()
    assert not trainer.is_offloaded
    assert all(p.device == trainer.device for p in trainer.model.parameters())


def test_staged_moves_swap_in_real_copies_and_lose_nothing(model_path):
    """`StagedMoves`, the trainer's way on CUDA (every host copy issued, one wait, then swapped in through
    `module._apply`), run here with `copy=clone` so each offload really puts a new tensor in place of every
    parameter, buffer and AdamW tensor (what a CPU cannot show with `.to("cpu")`, which hands back the tensor
    itself). The same Parameter objects hold the new storage (AdamW stays keyed by them), a tied weight stays
    one parameter, and the three kinds of step give bit for bit what a resident trainer gives. Not checked here:
    the pinning and the asynchrony, which only a GPU has (the GPU kit's offload stage); FSDP2's DTensors go the
    same way in the kit's trainer-stage dry run (tests/test_gpu_evidence.py)."""
    staged, resident = PolicyTrainer(model_path, **KWARGS), PolicyTrainer(model_path, **KWARGS)
    staged.host_moves = StagedMoves(copy=torch.Tensor.clone)
    samples = make_samples(8, seed=51)
    for trainer in (staged, resident):
        trainer.train_step(samples, count_response_tokens(samples))  # AdamW's state exists from here
    parameters = list(staged.model.parameters())
    addresses = [p.data_ptr() for p in parameters]
    moments = [value.data_ptr() for entry in staged.optimizer.state.values() for key, value in entry.items()
               if key != "step"]
    staged.offload()
    now = list(staged.model.parameters())
    assert len(now) == len(parameters) and all(a is b for a, b in zip(now, parameters))
    assert all(p.data_ptr() != address for p, address in zip(parameters, addresses))
    assert all(value.data_ptr() not in moments for entry in staged.optimizer.state.values()
               for key, value in entry.items() if key != "step")
    assert {id(p) for p in staged.optimizer.state} == {id(p) for p in parameters}
    if staged.model.config.tie_word_embeddings:
        assert staged.model.get_output_embeddings().weight is staged.model.get_input_embeddings().weight
    assert three_steps(staged, True) == three_steps(resident, False)
    staged.offload()
    assert_identical(staged.full_state_dict(), resident.full_state_dict())
    staged.offload()
    assert_identical(staged.state_for_checkpoint(), resident.state_for_checkpoint())
