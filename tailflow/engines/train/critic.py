"""One rank of the critic (train.advantage gae): a value model beside the policy, its own AdamW, the value loss.

The value model is the policy's architecture with a one-output head (`models.load_value_model`), built from the
policy's initial weights: it reads the tokens through the representation the policy starts from, and needs no
second model to ship. (A separate, smaller critic would cost less on large policies; on tailflow's models the
copy costs what a second trainer rank does.) It is laid out like the policy, by train.backend (FSDP2 shards over
this group's ranks; Megatron splits it in tensor-parallel groups, its head whole on every rank:
`megatron/gpt.ValueHead`), and trained by its own optimizer on its own schedule; checkpoints hold it beside the
policy.

Per step (the train task, tasks/train.py): `values` gives every sample's value at the positions that predict
its response tokens (no grad); GAE turns them into advantages and returns (`gae.py`); then `train_updates`
runs the clipped value loss on the model's tokens (the environment's tokens have mask 0), divided by the global
count of model tokens, one AdamW step per update (the policy's ppo_epochs x mini_batches), clipped by the
global gradient norm.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tailflow.config import TrainConfig
from tailflow.engines.train.batch import TrainSample, collate_on, plan_micro_batches
from tailflow.engines.train.gae import clipped_value_loss
from tailflow.engines.train.host_moves import HostMoves, moves_for
from tailflow.engines.train.policy_model import build_policy_model
from tailflow.engines.train.updates import Update

SUMMED = ("vf_loss", "clip_fraction", "vpred_mean")


@dataclass(frozen=True)
class CriticStepStats:
    vf_loss: float
    clip_fraction: float
    """Share of model tokens where the clipped squared error was the larger (no gradient there)."""
    vpred_mean: float
    """The values the loss saw, mean over model tokens (over the updates)."""
    grad_norm: float
    lr: float
    explained_variance: float = float("nan")
    """1 - Var(R - V) / Var(R) over the step's model tokens, V the values the advantages came from (before this
    step): how much of the returns' spread the critic predicted (`gae.explained_variance`)."""

    def metrics(self) -> dict[str, float]:
        """veRL's and ROLL's names."""
        return {"critic/vf_loss": self.vf_loss, "critic/vf_clipfrac": self.clip_fraction,
                "critic/vpred_mean": self.vpred_mean, "critic/values_explained_variance": self.explained_variance,
                "critic/grad_norm": self.grad_norm, "critic/lr": self.lr}


class CriticTrainer:
    def __init__(self, model_path: str, train: TrainConfig, rank: int = 0, world_size: int = 1,
                 backend: str | None = None) -> None:
        """`model_path`: the policy's initial model directory. `backend` None: nccl with CUDA, else gloo."""
        self.train, self.world_size = train, world_size
        torch.manual_seed(train.seed)
        dist_backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.value = build_policy_model(train.backend, model_path, rank, world_size, dist_backend,
                                        train.tensor_parallel_size, with_reference=False, value_head=True)
        self.device = self.value.device
        config = self.value.hf_config
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.optimizer = torch.optim.AdamW(self.value.module.parameters(), lr=train.critic.lr or train.lr,
                                           weight_decay=train.weight_decay)
        self.is_offloaded = False
        """The value model and AdamW's state are in host memory (`offload`); the next use moves them back."""
        self.host_moves: HostMoves = moves_for(self.device)

    @torch.no_grad()
    def values(self, samples: list[TrainSample]) -> list[tuple[float, ...]]:
        """Per sample, in order: its value at each position that predicts one of its response tokens."""
        self._ensure_on_device()
        found: dict[int, tuple[float, ...]] = {}
        for part in plan_micro_batches(samples, self.train.max_tokens_per_micro_batch, self.world_size, self.device,
                                       allow_empty=True):
            batch = collate_on(part, self.pad_id, self.device)
            values = self.value.logits(batch).squeeze(-1).float().cpu()
            for row, sample in enumerate(part):
                found[id(sample)] = tuple(values[row, sample.response_positions].tolist())
        return [found[id(sample)] for sample in samples]

    def train_updates(self, samples: list[TrainSample], updates: list[Update]) -> CriticStepStats:
        """One AdamW step per update on its samples (`values` and `returns` set: `gae.with_gae`)."""
        self._ensure_on_device()
        sums = dict.fromkeys(SUMMED, 0.0)
        grad_norms = []
        for update in updates:
            part_samples = [samples[i] for i in update.indices]
            for part in plan_micro_batches(part_samples, self.train.max_tokens_per_micro_batch, self.world_size,
                                           self.device, allow_empty=True):
                for name, value in self._accumulate(part, update.num_tokens).items():
                    sums[name] += value
            grad_norm = self.value.clip_grad_norm(self.train.max_grad_norm)
            if torch.isfinite(grad_norm):
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            grad_norms.append(grad_norm.item())
        totals = torch.tensor([sums[name] / len(updates) for name in SUMMED], dtype=torch.float64,
                              device=self.device)
        self.value.sum_over_replicas(totals)
        means = dict(zip(SUMMED, totals.tolist()))
        return CriticStepStats(**means, grad_norm=sum(grad_norms) / len(grad_norms),
                               lr=self.optimizer.param_groups[0]["lr"])

    def _accumulate(self, part: list[TrainSample], num_tokens_total: int) -> dict[str, float]:
        batch = collate_on(part, self.pad_id, self.device)
        old_values, returns = (torch.zeros_like(batch.response_mask) for _ in range(2))
        for row, sample in enumerate(part):
            old_values[row, sample.response_positions] = torch.tensor(sample.values, dtype=old_values.dtype)
            returns[row, sample.response_positions] = torch.tensor(sample.returns, dtype=returns.dtype)
        values = self.value.logits(batch).squeeze(-1).float()
        loss, stats = clipped_value_loss(values, old_values, returns, batch.response_mask, self.train.critic.value_clip,
                                         num_tokens_total)
        self.value.backward(loss)
        return {"vf_loss": stats.vf_loss, "clip_fraction": stats.clip_fraction, "vpred_mean": stats.vpred_mean}

    # ---- weights out and in (collectives: every rank calls them) ---------------------------------

    def state_for_checkpoint(self) -> dict:
        """{"model": the full value model's state (rank 0), "optimizer": AdamW's or None, "shard": this rank's own
        (Megatron) or None}."""
        self._ensure_on_device()
        return self.value.checkpoint_state(self.optimizer)

    def load_checkpoint(self, state: dict) -> None:
        self._ensure_on_device()
        self.value.load_checkpoint_state(self.optimizer, state)

    # ---- sharing the GPU with a rollout engine (colocated placement) -----------------------------

    def offload(self) -> None:
        """The value model and AdamW's state to host memory, as `PolicyTrainer.offload` moves the policy's (and
        on a CPU, the same no-op); every method that uses them moves them back first. Idempotent."""
        if self.is_offloaded:
            return
        self.optimizer.zero_grad(set_to_none=True)  # None between steps already
        self.host_moves.to_host((self.value.module,), self.optimizer)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.is_offloaded = True

    def _ensure_on_device(self) -> None:
        if self.is_offloaded:
            self.host_moves.to_device((self.value.module,), self.optimizer, self.device)
            self.is_offloaded = False
