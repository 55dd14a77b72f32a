"""The model half of a trainer rank, behind one interface: FSDP2 (`fsdp_model.py`) or Megatron-core
(`megatron/policy_model.py`), `train.backend`.

`PolicyTrainer` owns everything a step computes the same way whatever holds
the weights: micro-batching, the losses and their global denominators, the
stats, the streamed step, several updates, AdamW, offloading. A `PolicyModel`
owns what depends on how the weights are laid out over the ranks: building
and sharding them, the forward to full-vocabulary logits, the backward (and
how gradients combine over data-parallel replicas), the global gradient norm,
the weights as one Hugging Face state dict (weight sync, checkpoints' model
directory), and the checkpoint state of model and optimizer. The trainer
steps and offloads its `module` and `reference` itself.

Data parallelism is what the batch is cut by: FSDP2's ranks are all
data-parallel; Megatron's tensor-parallel ranks of one group see the same
samples, so a step's samples are sharded over `data_parallel_size` replicas
(`TrainerGroup`), and per-rank sums are reduced over the replicas only.
"""
from __future__ import annotations

from typing import Any, Literal, Protocol

import torch

from tailflow.engines.train.batch import MicroBatch

TrainBackend = Literal["fsdp2", "megatron"]


class PolicyModel(Protocol):
    device: torch.device
    hf_config: Any
    """The Hugging Face config of the model (pad token, vocabulary)."""
    module: torch.nn.Module
    """This rank's policy: its parameters are what AdamW steps."""
    reference: torch.nn.Module | None
    """The frozen reference copy (KL penalty only)."""

    def logits(self, batch: MicroBatch, reference: bool = False) -> torch.Tensor:
        """[B, T, V] full-vocabulary logits of the policy (or the frozen reference, KL only)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of `loss`, this rank's share of the global loss (divided by global counts)."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Combine the gradients over data-parallel replicas, return the global L2 norm, clip to `max_norm`."""

    def sum_over_replicas(self, sums: torch.Tensor) -> None:
        """In place: the sum of `sums` over the data-parallel replicas (per-rank stats)."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights with HF names, fresh CPU copies, on rank 0 ({} elsewhere); a collective."""

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """{"model": full_state_dict(), "optimizer": full optimizer state or None, "shard": this rank's own
        model and optimizer state or None}; a collective."""

    def load_checkpoint_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load `checkpoint_state`'s output (`shard`: this rank's own)."""


def build_policy_model(train_backend: TrainBackend, model_path: str, rank: int, world_size: int, dist_backend: str,
                       tensor_parallel: int, with_reference: bool, fsdp_mesh_of_one: bool = False,
                       value_head: bool = False) -> PolicyModel:
    """The `train.backend` wrapper, loaded with `model_path`'s weights (and a frozen reference copy for the
    KL penalty). megatron-core is imported only for `megatron`. `TrainConfig` has refused any other backend, and
    a tensor_parallel other than 1 with fsdp2. `fsdp_mesh_of_one`: FSDP2 shards even a world of one
    (`fsdp_model.py`; the GPU kit's use). `value_head`: the critic's value model (`logits` are [B, T, 1] values)."""
    if train_backend == "megatron":
        from tailflow.engines.train.megatron.policy_model import MegatronPolicyModel

        return MegatronPolicyModel(model_path, rank, world_size, dist_backend, tensor_parallel, with_reference,
                                   value_head=value_head)
    from tailflow.engines.train.fsdp_model import FsdpPolicyModel

    return FsdpPolicyModel(model_path, rank, world_size, dist_backend, with_reference, mesh_of_one=fsdp_mesh_of_one,
                           value_head=value_head)
