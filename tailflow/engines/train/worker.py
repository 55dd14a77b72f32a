"""A trainer rank: one `PolicyTrainer` behind plain methods, for `ray.remote`.

The cluster layer wraps this class (`engines/cluster/trainer_group.py`), as it
does the rollout and reward workers; here it is an ordinary class. Each rank
sets its torch.distributed environment before building its trainer, because
FSDP2's process group is created from it.
"""
from __future__ import annotations

import os

import torch

from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.trainer import PolicyTrainer, TrainStepStats
from tailflow.engines.train.updates import Update


class TrainerWorker:
    def __init__(self, model_path: str, rank: int, world_size: int, master_addr: str, master_port: int,
                 num_threads: int, trainer_kwargs: dict) -> None:
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        torch.set_num_threads(num_threads)
        self.rank = rank
        self.trainer = PolicyTrainer(model_path, rank=rank, world_size=world_size, **trainer_kwargs)

    def is_ready(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def train_step(self, samples: list[TrainSample], num_tokens_total: int, num_sequences_total: int,
                   num_metric_tokens: int) -> TrainStepStats:
        return self.trainer.train_step(samples, num_tokens_total, num_sequences_total, num_metric_tokens)

    def train_updates(self, samples: list[TrainSample], updates: list[Update], num_tokens_total: int
                      ) -> TrainStepStats:
        return self.trainer.train_updates(samples, updates, num_tokens_total)

    def accumulate(self, samples: list[TrainSample]) -> None:
        self.trainer.accumulate(samples)

    def finish_step(self, num_tokens_total: int, num_sequences_total: int, num_metric_tokens: int) -> TrainStepStats:
        return self.trainer.finish_step(num_tokens_total, num_sequences_total, num_metric_tokens)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.full_state_dict()

    def state_for_checkpoint(self) -> dict:
        return self.trainer.state_for_checkpoint()

    def load_checkpoint(self, state: dict) -> None:
        self.trainer.load_checkpoint(state)
