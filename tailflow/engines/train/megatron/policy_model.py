"""The Megatron-core policy model (`train.backend: megatron`): GPTModel ranks in tensor-parallel groups.

The world's ranks form `world_size / tensor_parallel` data-parallel replicas
of `tensor_parallel` consecutive ranks each (megatron-core's default order:
tensor parallel varies fastest), so rank r is replica r // tensor_parallel.
Every rank of a replica sees the same samples and computes the same full
logits (gathered, `gpt.py`), so the trainer's loss code is the FSDP2 one.
Pipeline parallelism is not built: the trainer runs its own forward and
backward per micro-batch, where megatron-core's pipeline schedules want to
own the micro-batch loop.

Gradients: a replica's tensor-parallel backward leaves each rank the exact
gradient of its shard; the replicas' gradients are summed (each rank's loss
is already its share of the global loss) before the norm. The global norm
counts each tensor-parallel shard once and each replicated tensor (norm
weights) once, and clipping follows torch's `clip_grad_norm_` formula, so
the numbers line up with FSDP2's (tests/test_megatron_alignment.py).

`value_head`: the critic (train.advantage gae), the same ranks and layout
with `gpt.ValueHead` in place of the vocabulary's output layer; its
`logits` are [B, T, 1] values and its weights convert to and from a Hugging
Face token-classification model's (`models.load_value_model`).

Checkpoints (not megatron's dist_checkpointing, which needs CUDA): rank 0
gathers the shards into the full Hugging Face state dict (what weight sync,
the checkpoint's model directory and `tailflow export` use), and every rank
keeps its own shard: its parameters and its AdamW state, resumed as they are.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from transformers import AutoConfig

from tailflow.engines.models import check_model_dir, load_model, load_value_model
from tailflow.engines.train.batch import MicroBatch
from tailflow.engines.train.megatron import cpu_stand_in
from tailflow.engines.train.megatron.convert import hf_to_megatron, megatron_to_hf
from tailflow.engines.train.megatron.gpt import build_gpt, gpt_logits, load_megatron_state, use_no_op_rng_tracker
from tailflow.engines.train.megatron.shape import ModelShape
from tailflow.engines.train.rank_setup import init_process_group, replace_with_copies


class MegatronPolicyModel:
    def __init__(self, model_path: str, rank: int, world_size: int, dist_backend: str, tensor_parallel: int,
                 with_reference: bool, value_head: bool = False) -> None:
        if tensor_parallel < 1 or world_size % tensor_parallel:
            raise ValueError(f"tensor_parallel {tensor_parallel} must divide the trainer's {world_size} ranks")
        check_model_dir(model_path)
        self.hf_config = AutoConfig.from_pretrained(model_path)
        self.shape = ModelShape.from_hf_config(self.hf_config)
        self.shape.check_tensor_parallel(tensor_parallel)
        self.rank, self.world_size, self.tensor_parallel = rank, world_size, tensor_parallel
        self.value_head = value_head
        self.device = init_process_group(dist_backend, rank, world_size, always=True)
        self._init_parallel_state()
        self.data_parallel_size = world_size // tensor_parallel
        hf_state = (load_value_model(model_path) if value_head else load_model(model_path)).state_dict()
        self.module = self._build(hf_state, is_trainable=True)
        self.reference = self._build(hf_state, is_trainable=False) if with_reference else None

    def _init_parallel_state(self) -> None:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()  # one trainer per process; a test may build several
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=self.tensor_parallel)
        cpu_stand_in.install_if_needed(self.device)
        use_no_op_rng_tracker()  # dropout is 0: nothing to seed, on any device
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        if parallel_state.get_data_parallel_rank() != self.rank // self.tensor_parallel:
            raise RuntimeError("megatron-core's rank order is not tensor-parallel-first; TrainerGroup's sharding "
                               "assumes it")
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.tp_src = parallel_state.get_tensor_model_parallel_src_rank()

    def _build(self, hf_state: dict[str, torch.Tensor], is_trainable: bool) -> torch.nn.Module:
        model = build_gpt(self.shape, self.tensor_parallel, value_head=self.value_head)
        load_megatron_state(model, self._to_megatron(hf_state))
        model.requires_grad_(is_trainable)
        return model.to(self.device).eval()

    def _to_megatron(self, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return hf_to_megatron(hf_state, self.shape, self.tensor_parallel, self.tp_rank, value_head=self.value_head)

    def logits(self, batch: MicroBatch, reference: bool = False) -> torch.Tensor:
        width = 1 if self.value_head else self.shape.vocab_size
        return gpt_logits(self.reference if reference else self.module, batch.input_ids, width)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Sum the replicas' gradients, then torch's `clip_grad_norm_` over the model's global gradient."""
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        grads = [(p, p.grad) for p in self.module.parameters() if p.grad is not None]
        if self.data_parallel_size > 1:
            for _, grad in grads:
                dist.all_reduce(grad, group=self.dp_group)
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for parameter, grad in grads:
            if param_is_not_tensor_parallel_duplicate(parameter):
                squares += torch.linalg.vector_norm(grad, dtype=torch.float32) ** 2
        if self.tensor_parallel > 1:
            dist.all_reduce(squares, group=self.tp_group)
        total_norm = squares.sqrt()
        clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
        for _, grad in grads:
            grad.mul_(clip_coef)
        return total_norm

    def sum_over_replicas(self, sums: torch.Tensor) -> None:
        if self.data_parallel_size > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.dp_group)

    def own_shard(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under their Megatron names (a tied output layer has none of its own), fresh CPU
        copies."""
        return {name: parameter.detach().to("cpu", copy=True) for name, parameter in self.module.named_parameters()}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every tensor-parallel group gathers its shards to its first rank; global rank 0 converts them."""
        shards = [self.own_shard()]
        if self.tensor_parallel > 1:
            shards = self._gather_shards(shards[0])
        return megatron_to_hf(shards, self.shape, value_head=self.value_head) if self.rank == 0 else {}

    def _gather_shards(self, own: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """[tensor-parallel rank] -> its shard, on the group's first rank ([] elsewhere); name by name."""
        is_source = self.tp_rank == 0
        gathered: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tensor_parallel)] if is_source else []
        for name in sorted(own):
            local = own[name].to(self.device)
            parts = [torch.empty_like(local) for _ in range(self.tensor_parallel)] if is_source else None
            dist.gather(local, parts, dst=self.tp_src, group=self.tp_group)
            for tp_rank, part in enumerate(parts or []):
                gathered[tp_rank][name] = part.cpu()
        return gathered

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict:
        shard = {"tensor_parallel": self.tensor_parallel, "world_size": self.world_size, "rank": self.rank,
                 "model": self.own_shard(), "optimizer": replace_with_copies(optimizer.state_dict())}
        return {"model": self.full_state_dict(), "optimizer": None, "shard": shard}

    def load_checkpoint_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """This rank's own shard as it was saved; a checkpoint with no shards (weights only, e.g. a warm start)
        loads its HF weights and keeps the optimizer fresh, and one with a full optimizer state but no shards
        (train.backend fsdp2) is refused: its AdamW state is not laid out like this rank's."""
        shard = state.get("shard")
        if shard is None:
            if state.get("optimizer") is not None:
                raise ValueError("this checkpoint has no Megatron shards (written by train.backend fsdp2?): its "
                                 "optimizer state cannot be resumed by train.backend megatron")
            load_megatron_state(self.module, self._to_megatron(state["model"]))
            return
        layout = (shard["tensor_parallel"], shard["world_size"], shard["rank"])
        if layout != (self.tensor_parallel, self.world_size, self.rank):
            raise ValueError(f"checkpoint shard of rank {layout[2]} of {layout[1]} at tensor_parallel {layout[0]}; "
                             f"this is rank {self.rank} of {self.world_size} at tensor_parallel {self.tensor_parallel}")
        load_megatron_state(self.module, shard["model"])
        optimizer.load_state_dict(shard["optimizer"])
