"""The Megatron backend on the Ray trainer actors: a tensor-parallel group's steps, per-rank checkpoint shards
through the checkpoint directory, exact resume, parking, and refusals of a checkpoint of the other backend."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from random_samples import make_samples
from tailflow.config import TrainConfig
from tailflow.engines.runs.checkpoint import SHARDS_DIR, read_checkpoint, write_checkpoint
from tailflow.engines.train.trainer import PolicyTrainer

torch.set_num_threads(1)

KWARGS = dict(train=TrainConfig(lr=1e-3, kl_coef=0.1, max_tokens_per_micro_batch=64, backend="megatron",
                                tensor_parallel=2, num_workers=2))
"""kl_coef > 0: each rank also holds a frozen Megatron reference model."""


@pytest.fixture(scope="module")
def warmstart_dir() -> str:
    from importlib import resources

    return str(resources.files("tailflow") / "assets" / "warmstart")


def assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
def test_a_tensor_parallel_group_checkpoints_per_rank_and_resumes_bit_for_bit(warmstart_dir, ray_cluster, tmp_path):
    """Costs ~20 s here (a TrainerGroup of two Ray actors, each importing megatron-core and loading the warm
    start, 3 train steps, a checkpoint written and read back): two tensor-parallel ranks are the fewest that
    write per-rank shards, which is what the resume must read."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    from tailflow.engines.cluster.trainer_group import TrainerGroup

    config, tokenizer = AutoConfig.from_pretrained(warmstart_dir), AutoTokenizer.from_pretrained(warmstart_dir)
    first, second = make_samples(10, seed=61), make_samples(10, seed=62)
    group = TrainerGroup(warmstart_dir, world_size=2, trainer_kwargs=KWARGS)
    try:
        assert group.data_parallel_size == 1  # both ranks are one tensor-parallel group: both get every sample
        stats = group.train_step(first)
        write_checkpoint(tmp_path / "ckpt", group.checkpoint(), config, tokenizer)
        group.train_step(second)
        trained = group.state_dict()
        group.park()  # the parked copy is what a commit writes: the same as the live state
        parked = group.checkpoint()
        group.load_checkpoint(read_checkpoint(tmp_path / "ckpt", config))
        group.train_step(second)
        resumed = group.state_dict()
        with pytest.raises(ValueError, match="no Megatron shards"):
            group.load_checkpoint({"model": trained, "optimizer": {"state": {}, "param_groups": []}})
    finally:
        group.shutdown()

    assert stats.grad_norm > 0 and stats.kl >= 0 and stats.num_samples == 10
    assert sorted(path.name for path in (tmp_path / "ckpt" / SHARDS_DIR).iterdir()) == ["rank_00000.pt",
                                                                                         "rank_00001.pt"]
    assert_bit_equal(resumed, trained)  # each rank resumed its own parameters and AdamW state
    assert_bit_equal(parked["model"], trained) and len(parked["shards"]) == 2
    shard = parked["shards"][1]
    assert (shard["rank"], shard["tensor_parallel"]) == (1, 2) and shard["optimizer"]["state"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)  # what engines load
    saved = read_checkpoint(tmp_path / "ckpt", config)["model"]
    assert_bit_equal({k: v for k, v in exported.state_dict().items()}, saved)


def test_fsdp2_refuses_a_checkpoint_with_megatron_shards(model_path):
    trainer = PolicyTrainer(model_path, TrainConfig(lr=1e-3))
    state = trainer.state_for_checkpoint()
    with pytest.raises(ValueError, match="Megatron shards"):
        trainer.load_checkpoint({**state, "shard": {"rank": 0}})
