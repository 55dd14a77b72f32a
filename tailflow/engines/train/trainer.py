"""One rank of the GRPO policy trainer: the loss side of a step, AdamW, and a `PolicyModel` (FSDP2 or
Megatron-core, `train.backend`; `policy_model.py`) for everything that depends on how the weights are sharded.

A step (`train_step`): cut this rank's samples into micro-batches (every rank
runs the same number, padding with empty ones, because each forward and
backward is a collective under FSDP2 and Megatron's tensor parallelism) -> the reference log-probs without grad
(KL only) -> per micro-batch, the policy loss over a GLOBAL count (response
tokens, or sequences with `loss_agg`; losses.loss_denominator) and backward
(gradients accumulate) -> clip by the global grad norm -> one AdamW step ->
sum the stats over data-parallel replicas. With one optimizer step the proximal ("old")
log-probs are the forward's own, detached: no second pass.

Several updates per step (train.ppo_epochs x train.mini_batches): `train_updates`,
each update the step above on its mini-batch.

A streamed step (`accumulate` ... `finish_step`, train.stream): the batch
arrives in pieces while its counts are still unknown, so each piece
backpropagates the UNNORMALISED sums (divisor 1) and `finish_step` divides the
accumulated gradients by the loss denominator before clipping and the
optimizer step. The gradient is linear in the loss, so this is the
non-streamed step's gradient up to float summation order.

Multi-turn samples (`TrainSample.response_mask`) need nothing here: `collate` zeroes their environment tokens'
response-mask positions, and every loss, KL, entropy and rollout-diff term reads that mask, on either backend.

Colocated placement (one GPU shared by a rollout engine and this rank, the phases taking turns): `offload`.
With world_size == 1 and FSDP2: plain single-process training (`fsdp_model.py`).
Plain Python: Ray wraps it in `engines/cluster/trainer_group.py`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Sequence

import torch

from tailflow.config import TrainConfig
from tailflow.engines.train.batch import (
    MicroBatch,
    TrainSample,
    collate_on,
    plan_micro_batches,
    rollout_logprobs_matrix,
)
from tailflow.engines.train.losses import (
    LOSSES,
    PolicyLossInputs,
    entropy_from_logits,
    kl_penalty,
    loss_denominator,
    token_logprobs,
)
from tailflow.engines.train.critic import CriticStepStats
from tailflow.engines.train.host_moves import HostMoves, moves_for
from tailflow.engines.train.policy_model import PolicyModel, build_policy_model
from tailflow.engines.train.updates import Update

SUMMED_STATS = (
    "pg_loss", "clip_fraction", "approx_kl", "kl", "entropy", "rollout_abs_diff", "rollout_tokens", "samples"
)
"""Per-rank sums all-reduced at the end of a step (pg_loss and kl are already / the loss denominator, the
next three / num_tokens_total)."""


@dataclass(frozen=True)
class TrainStepStats:
    """One step's metrics, identical on every rank. Token means are over the global batch."""

    pg_loss: float
    kl: float
    """k3 KL to the reference model; 0 when kl_coef == 0 (no reference loaded)."""
    entropy: float
    grad_norm: float
    """Global L2 norm before clipping; non-finite means the optimizer step was skipped."""
    lr: float
    clip_fraction: float
    approx_kl: float
    """k3 KL(old || new) of the PPO ratio."""
    num_tokens: int
    """The model's response tokens in the global batch (the token_mean denominator; environment tokens of a
    multi-turn sample are not counted)."""
    num_samples: int
    logprob_diff_vs_rollout: float | None = None
    """Mean |log pi - log mu| over the response tokens sampled at the trainer's temperature: pi the trainer's
    softmax(logits / T), mu the engine's sampling distribution at the same T (None: no such token). Without
    top-k / top-p it is the engines' and trainers' numeric disagreement (plus staleness, async); with them mu
    is renormalised over the tokens kept, so it also holds -log(mass kept) of each token's step."""
    skipped_samples: int = 0
    """Samples left out of the forward and backward (zero advantage, `train.skip_zero_advantage`)."""
    seconds: float = 0.0
    """The step's wall time, from the driver (`time/step_train`); 0 where nobody timed it. A streamed step:
    only the part after rollout (the train time rollout did not hide)."""
    num_optimizer_steps: int = 1
    """AdamW steps taken (train.ppo_epochs x train.mini_batches); the stats above are means over them."""
    streamed_groups: int | None = None
    """Streamed step (train.stream): groups trained while the round still rolled out; None: not streamed."""
    critic: CriticStepStats | None = None
    """train.advantage gae: the critic's step beside this one (None: no critic)."""

    def metrics(self) -> dict[str, float]:
        """ROLL-compatible names (see ARCHITECTURE.md)."""
        names = ("pg_loss", "kl", "entropy", "grad_norm", "lr", "clip_fraction", "approx_kl")
        out = {f"actor/{name}": float(getattr(self, name)) for name in names}
        if self.logprob_diff_vs_rollout is not None:
            out["actor/logprob_diff_vs_rollout"] = self.logprob_diff_vs_rollout
        out["actor/skipped_samples"] = self.skipped_samples
        out["actor/optimizer_steps"] = self.num_optimizer_steps
        if self.streamed_groups is not None:
            out["time/stream_overlap_groups"] = self.streamed_groups
            out["time/train_exposed"] = self.seconds
        if self.critic is not None:
            out |= self.critic.metrics()
        return out


@dataclass(frozen=True)
class MicroBatchInputs:
    """What one micro-batch's loss needs besides its tokens: [B, T] tensors (no grad)."""

    ref_logprobs: torch.Tensor | None
    """The reference model's log-probs (KL penalty only)."""
    behaviour_logprobs: torch.Tensor
    """The rollout engine's log-probs of the sampled tokens (0 where none were reported)."""
    has_behaviour: torch.Tensor
    """1 where `behaviour_logprobs` holds a value of a sample drawn at the trainer's temperature (what
    actor/logprob_diff_vs_rollout compares)."""
    proximal_logprobs: torch.Tensor | None = None
    """The weights' log-probs at the start of a step of several updates; None: the forward's own, detached."""


class PolicyTrainer:
    def __init__(self, model_path: str, train: TrainConfig | None = None, rank: int = 0, world_size: int = 1,
                 backend: str | None = None, max_new_tokens: int | None = None, temperature: float = 1.0,
                 fsdp_mesh_of_one: bool = False) -> None:
        """`train`: the run's `train.*` section (None: its defaults): the optimizer (lr, weight_decay,
        max_grad_norm), the loss (`loss`, `loss_agg`, clip_low / clip_high, is_cap, kl_coef), the micro-batch
        budget, the seed, and the model wrapper (`train.backend`, Megatron's `tensor_parallel_size`). `backend`
        None picks "nccl" when CUDA is present, else "gloo". With world_size > 1 the process group is made from
        env MASTER_ADDR / MASTER_PORT (set by TrainerGroup). `max_new_tokens` (rollout.max_new_tokens) is what
        loss_agg `constant` divides by (losses.loss_denominator); `temperature` is the rollouts' sampling
        temperature: the trainer's logits are divided by it, so its log-probs are those of the distribution the
        tokens were drawn from. `fsdp_mesh_of_one`: FSDP2 shards even with world_size 1, over a group of one
        (the GPU kit runs FSDP2's sharded path on one GPU with it; runs never set it)."""
        self.train = train if train is not None else TrainConfig()
        self.max_new_tokens, self.temperature, self.world_size = max_new_tokens, temperature, world_size
        self._loss_denominator(1, 1)  # a bad choice fails here, not at the first step
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 to train on sampled responses, got {temperature}")
        torch.manual_seed(self.train.seed)
        dist_backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.policy: PolicyModel = build_policy_model(self.train.backend, model_path, rank, world_size, dist_backend,
                                                      self.train.tensor_parallel_size,
                                                      with_reference=self.train.kl_coef > 0,
                                                      fsdp_mesh_of_one=fsdp_mesh_of_one)
        self.device = self.policy.device
        config = self.policy.hf_config
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.train.lr,
                                           weight_decay=self.train.weight_decay)
        self._streamed: dict[str, float] | None = None
        """A streamed step's summed stats so far (None: no streamed step open)."""
        self.is_offloaded = False
        """The weights and AdamW's state are in host memory (`offload`); the next use moves them back."""
        self.host_moves: HostMoves = moves_for(self.device)
        """How `offload` and the way back move the tensors (`host_moves.py`): staged through pinned memory on
        CUDA, one blocking `.to` each elsewhere."""

    @property
    def model(self) -> torch.nn.Module:
        """The policy module itself (FSDP2: the Hugging Face model; Megatron: this rank's GPTModel)."""
        return self.policy.module

    @property
    def ref_model(self) -> torch.nn.Module | None:
        return self.policy.reference

    # ---- the step ------------------------------------------------------------------------------

    def train_step(
        self, samples: list[TrainSample], num_tokens_total: int, num_sequences_total: int | None = None,
        num_metric_tokens: int | None = None,
    ) -> TrainStepStats:
        """One optimizer step on this rank's `samples`; `num_tokens_total` counts response tokens and
        `num_sequences_total` samples (None: this rank's, the single-process case) of the whole step's batch
        on ALL ranks: the loss divides by them. `num_metric_tokens` (None: num_tokens_total) divides the token
        means reported (entropy, clip fraction, approx KL): the response tokens trained, when samples with no
        gradient were left out of `samples`."""
        self._ensure_on_device()
        if num_tokens_total < 1:
            raise ValueError(f"num_tokens_total must be >= 1, got {num_tokens_total}")
        num_sequences = len(samples) if num_sequences_total is None else num_sequences_total
        denominator = self._loss_denominator(num_tokens_total, num_sequences)
        metric_tokens = num_metric_tokens or num_tokens_total
        totals = self._backward(samples, metric_tokens, denominator)
        grad_norm = self._clip_and_step()
        return self._reduce_stats(totals, grad_norm, num_tokens_total)

    def train_updates(self, samples: list[TrainSample], updates: Sequence[Update],
                      num_tokens_total: int) -> TrainStepStats:
        """One optimizer step per update (`updates.plan_updates`, the same count on every rank), each dividing its
        loss by its own mini-batch's global counts. The proximal log-probs are computed once, before the first
        update, and only where the loss clips against them (ppo_clip, decoupled_ppo); one update is `train_step`,
        with no such pass. Reported: means over the updates (the grad norm too); `num_tokens_total` is the
        whole batch's."""
        self._ensure_on_device()
        if len(updates) == 1:
            update = updates[0]
            return self.train_step([samples[i] for i in update.indices], update.num_tokens, update.num_sequences,
                                   update.num_metric_tokens)
        self._check_rollout_logprobs(samples)  # all of them before the first update steps
        proximal = self._proximal_logprobs(samples) if LOSSES[self.train.loss].proximal else None
        sums = dict.fromkeys(SUMMED_STATS, 0.0)
        grad_norms = []
        for update in updates:
            denominator = self._loss_denominator(update.num_tokens, update.num_sequences)
            totals = self._backward([samples[i] for i in update.indices], update.num_metric_tokens or update.num_tokens,
                                    denominator, proximal, allow_empty=True)
            grad_norms.append(self._clip_and_step())
            for name in SUMMED_STATS:
                sums[name] += totals[name]
        means = {name: value / len(updates) for name, value in sums.items()}
        # the rollout diff is a ratio of sums; the sample count is the batch's, not a mean
        means |= {name: sums[name] for name in ("rollout_abs_diff", "rollout_tokens")} | {"samples": len(samples)}
        stats = self._reduce_stats(means, sum(grad_norms) / len(grad_norms), num_tokens_total)
        return replace(stats, num_optimizer_steps=len(updates))

    def accumulate(self, samples: list[TrainSample]) -> None:
        """Forward and backward of a piece of a streamed step, the loss NOT divided (divisor 1): gradients of the
        sums accumulate until `finish_step`. Every rank calls it the same number of times ([] runs a filler)."""
        self._ensure_on_device()
        totals = self._backward(samples, 1, 1, allow_empty=True)
        self._streamed = {name: (self._streamed or {}).get(name, 0.0) + totals[name] for name in SUMMED_STATS}

    def finish_step(self, num_tokens_total: int, num_sequences_total: int,
                    num_metric_tokens: int | None = None) -> TrainStepStats:
        """Close a streamed step: divide the accumulated gradients by the loss denominator of the whole batch
        (its counts as in `train_step`, known only now), clip, one AdamW step. Exactly `train_step` on all the
        pieces at once, up to float summation order: the loss is a sum divided by a constant."""
        self._ensure_on_device()
        if self._streamed is None:
            raise RuntimeError("finish_step without accumulate: no streamed step is open")
        denominator = self._loss_denominator(num_tokens_total, num_sequences_total)
        metric_tokens = num_metric_tokens or num_tokens_total
        with torch.no_grad():
            for parameter in self.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.div_(denominator)
        grad_norm = self._clip_and_step()
        totals, self._streamed = self._streamed, None
        for name in ("pg_loss", "kl"):
            totals[name] /= denominator
        for name in ("clip_fraction", "approx_kl", "entropy"):
            totals[name] /= metric_tokens
        return self._reduce_stats(totals, grad_norm, num_tokens_total)

    def _loss_denominator(self, num_tokens: int, num_sequences: int) -> int:
        """What the loss divides by (`train.loss_agg`; losses.loss_denominator): counts over the batch's ranks."""
        return loss_denominator(self.train.loss_agg, num_tokens, num_sequences, self.max_new_tokens)

    def _backward(self, samples: list[TrainSample], metric_tokens: int, denominator: int,
                  proximal: dict[int, torch.Tensor] | None = None, allow_empty: bool = False) -> dict[str, float]:
        """Forward and backward of every micro-batch of `samples` (gradients accumulate); their SUMMED_STATS."""
        self._check_rollout_logprobs(samples)
        totals = dict.fromkeys(SUMMED_STATS, 0.0) | {"samples": float(len(samples))}
        for part in self._plan_micro_batches(samples, allow_empty):
            batch = self._collate(part)
            inputs = self._micro_batch_inputs(part, batch, proximal)
            for name, value in self._accumulate_gradients(batch, inputs, metric_tokens, denominator).items():
                totals[name] += value
        return totals

    def _check_rollout_logprobs(self, samples: list[TrainSample]) -> None:
        """An off-policy loss weighs by pi / mu, pi the trainer's softmax(logits / temperature) and mu the
        distribution that sampled the token (its recorded log-prob): refuse, before any gradient, samples without
        a log-prob for every response token or sampled at another (or an unknown) temperature."""
        loss = self.train.loss
        if not LOSSES[loss].off_policy:
            return
        if any(sample.rollout_logprobs is None for sample in samples):
            raise ValueError(f"train.loss {loss!r} needs the rollout log-prob of every response token; "
                             "some samples have none")
        others = {sample.rollout_temperature for sample in samples} - {self.temperature}
        if others:
            raise ValueError(
                f"train.loss {loss!r} weighs by pi / mu with pi at this trainer's temperature {self.temperature}, "
                f"but samples were sampled at temperature {sorted(others, key=str)} (None: not recorded), so their "
                "log-probs are of another distribution: construct PolicyTrainer with temperature=rollout.temperature "
                "and build the samples with rollout_temperature (samples_from_groups)")

    def _plan_micro_batches(self, samples: list[TrainSample], allow_empty: bool = False) -> list[list[TrainSample]]:
        return plan_micro_batches(samples, self.train.max_tokens_per_micro_batch, self.world_size, self.device,
                                  allow_empty)

    @torch.no_grad()
    def _proximal_logprobs(self, samples: list[TrainSample]) -> dict[int, torch.Tensor]:
        """id(sample) -> [L] log-probs of its response tokens under the current weights (one no-grad pass)."""
        found = {}
        for part in self._plan_micro_batches(samples, allow_empty=True):
            logprobs = self._logprobs(self._collate(part))[1]
            for row, sample in enumerate(part):
                found[id(sample)] = logprobs[row, sample.response_positions].clone()
        return found

    def _collate(self, part: list[TrainSample]) -> MicroBatch:
        return collate_on(part, self.pad_id, self.device)

    def _logprobs(self, batch: MicroBatch, reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, T, V] logits / temperature, [B, T] next-token log-probs of that distribution), of the policy or
        (`reference`) the frozen reference model."""
        logits = self.policy.logits(batch, reference)
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return logits, token_logprobs(logits, batch.input_ids)

    @torch.no_grad()
    def _micro_batch_inputs(self, part: list[TrainSample], batch: MicroBatch,
                            proximal: dict[int, torch.Tensor] | None = None) -> MicroBatchInputs:
        """No old-log-prob pass here: with one optimizer step the weights at the start of the step are the ones
        that take the gradient, so the proximal (old) log-probs are the forward's own, detached; with several,
        `proximal` holds them (`_proximal_logprobs`). Only a KL penalty needs a second model's pass."""
        ref_logprobs = self._logprobs(batch, reference=True)[1] if self.ref_model is not None else None
        if not part:  # a filler row (this rank has fewer micro-batches than another)
            zeros = torch.zeros_like(batch.response_mask)
            return MicroBatchInputs(ref_logprobs, zeros, zeros, None if proximal is None else zeros)
        behaviour, present = (t.to(self.device) for t in rollout_logprobs_matrix(part, batch.input_ids.shape[1]))
        # like with like: only rows sampled at this trainer's temperature enter actor/logprob_diff_vs_rollout
        present = present * torch.tensor([[float(s.rollout_temperature == self.temperature)] for s in part],
                                         device=self.device)
        proximal_matrix = None
        if proximal is not None:
            proximal_matrix = torch.zeros_like(batch.response_mask)
            for row, sample in enumerate(part):
                proximal_matrix[row, sample.response_positions] = proximal[id(sample)]
        return MicroBatchInputs(ref_logprobs, behaviour, present, proximal_matrix)

    def _policy_loss(self, logprobs: torch.Tensor, batch: MicroBatch, inputs: MicroBatchInputs,
                     metric_tokens: int, denominator: int):
        """`train.loss` as the table of losses (losses.LOSSES) calls it: the on-policy clip, or a correction for the
        behaviour policy. The loss divides by `denominator`, the reported token means by `metric_tokens`."""
        proximal = logprobs.detach() if inputs.proximal_logprobs is None else inputs.proximal_logprobs
        loss_inputs = PolicyLossInputs(logprobs, proximal, inputs.behaviour_logprobs, batch.advantages,
                                       batch.response_mask, num_tokens_total=metric_tokens,
                                       loss_denominator=denominator)
        return LOSSES[self.train.loss].compute(loss_inputs, self.train)

    def _accumulate_gradients(
        self, batch: MicroBatch, inputs: MicroBatchInputs, metric_tokens: int, denominator: int
    ) -> dict[str, float]:
        """Forward + backward of one micro-batch; returns its share of the step's SUMMED_STATS."""
        logits, logprobs = self._logprobs(batch)
        mask = batch.response_mask
        pg_loss, pg_stats = self._policy_loss(logprobs, batch, inputs, metric_tokens, denominator)
        ref = inputs.ref_logprobs
        kl = kl_penalty(logprobs, ref, mask, denominator) if ref is not None else None
        loss = pg_loss + self.train.kl_coef * kl if kl is not None else pg_loss
        self.policy.backward(loss)  # each rank's loss is its share of the global loss: the ranks' grads SUM
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), mask, metric_tokens).item()
            present = inputs.has_behaviour
            abs_diff = ((logprobs.detach() - inputs.behaviour_logprobs).abs() * present).sum().item()
        return asdict(pg_stats) | {"kl": kl.item() if kl is not None else 0.0, "entropy": entropy,
                                   "rollout_abs_diff": abs_diff, "rollout_tokens": present.sum().item()}

    def _clip_and_step(self) -> float:
        """Clip by the global norm (over every rank's gradients), then exactly one AdamW step."""
        grad_norm = self.policy.clip_grad_norm(self.train.max_grad_norm)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.item()

    def _reduce_stats(self, totals: dict[str, float], grad_norm: float, num_tokens_total: int) -> TrainStepStats:
        sums = torch.tensor([totals[name] for name in SUMMED_STATS], dtype=torch.float64, device=self.device)
        self.policy.sum_over_replicas(sums)
        total = dict(zip(SUMMED_STATS, sums.tolist()))
        rollout_diff = total["rollout_abs_diff"] / total["rollout_tokens"] if total["rollout_tokens"] > 0 else None
        means = {name: total[name] for name in ("pg_loss", "kl", "entropy", "clip_fraction", "approx_kl")}
        return TrainStepStats(**means, grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"],
                              num_tokens=num_tokens_total, num_samples=int(total["samples"]),
                              logprob_diff_vs_rollout=rollout_diff)

    # ---- weights out and in (collectives: every rank calls them) ---------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full CPU state dict with HF names on rank 0 ({} on the other ranks); never aliases live weights."""
        self._ensure_on_device()
        return self.policy.full_state_dict()

    def state_for_checkpoint(self) -> dict:
        """{"model": full state dict (rank 0), "optimizer": full optimizer state or None, "shard": this rank's own
        model and optimizer state (Megatron) or None}: `PolicyModel.checkpoint_state`."""
        self._ensure_on_device()
        return self.policy.checkpoint_state(self.optimizer)

    def load_checkpoint(self, state: dict) -> None:
        """Load `state_for_checkpoint()`'s output: the full dict on every rank, with this rank's own `shard`."""
        self._ensure_on_device()
        self.policy.load_checkpoint_state(self.optimizer, state)

    # ---- sharing the GPU with a rollout engine (colocated placement) -----------------------------

    def offload(self) -> None:
        """Move the policy's and the reference model's parameters and every AdamW state tensor to host memory,
        drop the gradients, and (CUDA) release the freed blocks, so the colocated rollout engine gets the GPU
        memory while it rolls out. Every public method that uses the weights or the optimizer moves them back
        first, so nothing depends on the caller remembering to; offloading only saves memory. Idempotent.

        Refused during a streamed step (`accumulate` ... `finish_step`): its accumulated gradients live on the
        device and are half of that step.

        How the tensors move is `self.host_moves` (`host_moves.py`): on CUDA every copy is issued into pinned
        host memory and waited for once (`StagedMoves`); on a CPU, where the device IS host memory, one `.to` per
        tensor that returns the tensor itself (`BlockingMoves`), so the CPU tests check the bookkeeping and that
        nothing is lost. The blocking way, on an H200 (the GPU kit's turns stage, one unsharded 0.5B-shape
        trainer), freed 5,661 MiB but took 12.0 s, about 0.5 GB/s; the staged way has not run on a GPU yet
        (the kit's `offload` stage puts both side by side, docs/gpu.md).
        """
        if self._streamed is not None:
            raise RuntimeError("offload() while a streamed step is open: its gradients live on the device; "
                               "call finish_step first")
        if self.is_offloaded:
            return
        self.optimizer.zero_grad(set_to_none=True)  # None between steps already; nothing of a step is dropped
        self.host_moves.to_host((self.model, self.ref_model), self.optimizer)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.is_offloaded = True

    def reload(self) -> None:
        """Bring an offloaded state back now (every method that needs it does so itself: this only does it
        ahead of time, and lets the GPU kit time the move alone). A no-op when not offloaded."""
        self._ensure_on_device()

    def _ensure_on_device(self) -> None:
        """Bring the offloaded state back to `self.device`: the first line of every public method using it."""
        if self.is_offloaded:
            self.host_moves.to_device((self.model, self.ref_model), self.optimizer, self.device)
            self.is_offloaded = False
