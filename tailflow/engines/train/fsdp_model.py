"""The FSDP2 policy model (`train.backend: fsdp2`): a Hugging Face model, each decoder layer and the root
sharded over all ranks (every rank a data-parallel replica).

With world_size 1 no process group is made and nothing is sharded: plain
single-process training, the reference the sharded path is tested against.
`mesh_of_one` shards anyway, over a process group of one rank: the sharded
code path (DTensor parameters, FSDP2's `_apply`, the gathered state dict) on a
machine with one GPU, which is how the GPU kit's `trainer` stage checks it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from tailflow.engines.models import load_model, load_value_model
from tailflow.engines.train.batch import MicroBatch
from tailflow.engines.train.rank_setup import init_process_group, replace_with_copies


class FsdpPolicyModel:
    def __init__(self, model_path: str, rank: int, world_size: int, dist_backend: str, with_reference: bool,
                 mesh_of_one: bool = False, value_head: bool = False) -> None:
        """`value_head`: the critic (train.advantage gae), the same architecture with a one-output head
        (`models.load_value_model`): its `logits` are [B, T, 1] values."""
        self.value_head = value_head
        self.rank, self.world_size = rank, world_size
        self.device = init_process_group(dist_backend, rank, world_size, always=mesh_of_one)
        sharded = world_size > 1 or mesh_of_one
        self.mesh = init_device_mesh(self.device.type, (world_size,)) if sharded else None
        self.module = self._load(model_path, is_trainable=True)
        self.reference = self._load(model_path, is_trainable=False) if with_reference else None
        self.hf_config = self.module.config

    def _load(self, path: str, is_trainable: bool) -> PreTrainedModel:
        """Load, then shard each decoder layer and the root (tied embedding and lm_head share the root group).

        The model stays in eval mode (no dropout) so the recomputed old log-probs are the policy's own.
        """
        model = (load_value_model(path) if self.value_head else load_model(path)).to(self.device).eval()
        model.requires_grad_(is_trainable)
        if self.mesh is not None:
            for layer in getattr(model, model.base_model_prefix).layers:
                fully_shard(layer, mesh=self.mesh)
            fully_shard(model, mesh=self.mesh)
        return model

    def logits(self, batch: MicroBatch, reference: bool = False) -> torch.Tensor:
        model = self.reference if reference else self.module
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits

    def backward(self, loss: torch.Tensor) -> None:
        """FSDP2 AVERAGES gradients over ranks, but each rank's loss is already its share of the global loss
        (divided by a global count): multiply back so the ranks' grads SUM."""
        (loss * self.world_size).backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """torch's clip by the global norm (DTensor grads reduce across ranks)."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        return grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm

    def sum_over_replicas(self, sums: torch.Tensor) -> None:
        if self.world_size > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state_dict = get_model_state_dict(self.module, options=options)
        # Unsharded, torch returns the live parameters themselves. Sharded, FSDP gathers into fresh tensors over
        # more than one rank, and a GPU's CPU offload copies; a mesh of one on the CPU may hand back its one shard
        # itself (nothing to gather, nothing to move), so that case is copied too.
        fresh = self.mesh is not None and (self.world_size > 1 or self.device.type != "cpu")
        return state_dict if fresh else replace_with_copies(state_dict)

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """Full model and optimizer state on rank 0; no per-rank shard (the full state loads on any rank count).
        The optimizer state is None before the first step because torch's helper would initialise Adam's
        state with a zero-gradient step, changing the run it checkpoints."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optimizer_state = None
        if optimizer.state:  # the same on every rank: all have stepped, or none has
            optimizer_state = get_optimizer_state_dict(self.module, optimizer, options=options)
        # The optimizer's state comes back as live tensors where not sharded (always Adam's `step`).
        return {"model": self.full_state_dict(), "optimizer": replace_with_copies(optimizer_state), "shard": None}

    def load_checkpoint_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Every rank passes the same full dict and keeps its shard."""
        if state.get("shard") is not None:
            raise ValueError("this checkpoint holds per-rank Megatron shards (train.backend megatron); "
                             "train.backend fsdp2 cannot resume it")
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.module, state["model"], options=options)
        if state["optimizer"] is not None:
            set_optimizer_state_dict(self.module, optimizer, state["optimizer"], options=options)
