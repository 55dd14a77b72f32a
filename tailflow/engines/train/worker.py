"""A trainer rank: one `PolicyTrainer` (or, role critic, one `CriticTrainer`) behind plain methods, for
`ray.remote`.

The cluster layer wraps this class (`engines/cluster/trainer_group.py`), as it
does the rollout and reward workers; here it is an ordinary class. Each rank
sets its torch.distributed environment before building its trainer, because
FSDP2's process group is created from it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.critic import CriticStepStats, CriticTrainer
from tailflow.engines.train.trainer import PolicyTrainer, TrainStepStats
from tailflow.engines.train.updates import Update

TrainerRole = Literal["policy", "critic"]


@dataclass(frozen=True)
class RankCheckpoint:
    """One rank's part of a checkpoint as `state_for_checkpoint` returns it through Ray: the full model and
    optimizer state (rank 0; other ranks: what `checkpoint_state` gives there) and the rank's own shard (Megatron)
    or None.

    A record, not the dict it replaces, because of what Ray 2.60 does with a returned dict: it encodes it with
    msgpack, whose decoder interns every str key. The driver then put the parameter names into CPython's
    interned-string table at each commit and took them out when the checkpoint was freed. The dead slots filled
    the table until it doubled: +3.8 MB in a resumed driver after ~350 micro iterations (`bench/longrun.py`,
    docs/operations.md). A record is pickled whole, and unpickling it interns only its three field names."""
    model: dict[str, torch.Tensor]
    optimizer: dict | None
    shard: dict | None


class TrainerWorker:
    def __init__(self, model_path: str, rank: int, world_size: int, num_threads: int, trainer_kwargs: dict,
                 role: TrainerRole = "policy") -> None:
        """Nothing is loaded yet: the ranks meet at rank 0's node, which is known only once Ray has placed rank 0
        (`TrainerGroup` asks it, then calls `connect` on every rank). `role` critic: the rank holds the value
        model of train.advantage gae (`CriticTrainer`; of `trainer_kwargs` it reads `train` and `backend`)."""
        torch.set_num_threads(num_threads)
        self.model_path, self.rank, self.world_size = model_path, rank, world_size
        self.trainer_kwargs, self.role = trainer_kwargs, role
        self.trainer: PolicyTrainer | CriticTrainer | None = None

    def connect(self, master_addr: str, master_port: int) -> None:
        """Join the process group at rank 0's address and build this rank's trainer (a collective: every rank
        calls it)."""
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.rank))
        if self.role == "critic":
            self.trainer = CriticTrainer(self.model_path, self.trainer_kwargs["train"], rank=self.rank,
                                         world_size=self.world_size, backend=self.trainer_kwargs.get("backend"))
        else:
            self.trainer = PolicyTrainer(self.model_path, rank=self.rank, world_size=self.world_size,
                                         **self.trainer_kwargs)

    def pid(self) -> int:
        return os.getpid()

    def train_updates(self, samples: list[TrainSample], updates: list[Update], num_tokens_total: int
                      ) -> TrainStepStats:
        return self.trainer.train_updates(samples, updates, num_tokens_total)

    def values(self, samples: list[TrainSample]) -> list[tuple[float, ...]]:
        """The critic's values of each sample's response tokens (`CriticTrainer.values`)."""
        return self.trainer.values(samples)

    def train_value_updates(self, samples: list[TrainSample], updates: list[Update]) -> CriticStepStats:
        return self.trainer.train_updates(samples, updates)

    def accumulate(self, samples: list[TrainSample]) -> None:
        self.trainer.accumulate(samples)

    def finish_step(self, num_tokens_total: int, num_sequences_total: int, num_metric_tokens: int) -> TrainStepStats:
        return self.trainer.finish_step(num_tokens_total, num_sequences_total, num_metric_tokens)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.trainer.full_state_dict()

    def state_for_checkpoint(self) -> RankCheckpoint:
        state = self.trainer.state_for_checkpoint()
        return RankCheckpoint(state["model"], state["optimizer"], state["shard"])

    def load_checkpoint(self, state: dict, shard: dict | None = None) -> None:
        """`state`: the full {"model", "optimizer"} every rank reads; `shard`: this rank's own, where kept."""
        self.trainer.load_checkpoint({**state, "shard": shard})

    def offload(self) -> None:
        """Weights and optimizer state to host memory while the colocated rollout engine uses the GPU; the next
        call that needs them moves them back (`PolicyTrainer.offload`)."""
        self.trainer.offload()

    def park(self) -> tuple[dict, dict | None, dict | None]:
        """The three parts of `state_for_checkpoint` (rank 0: full dicts; other ranks: what it gives there; every
        rank's own shard or None), taken before offloading, then offload: one call saves what a checkpoint needs
        and frees the GPU for the rollout. The caller uses `.options(num_returns=3)`, so the parts land as three
        objects."""
        state = self.state_for_checkpoint()
        self.trainer.offload()
        return state.model, state.optimizer, state.shard

    def is_offloaded(self) -> bool:
        return self.trainer.is_offloaded
