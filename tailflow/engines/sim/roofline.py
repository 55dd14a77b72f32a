"""The `roofline` cost model: a GPU decode step from bytes moved and FLOPs done.

One rollout replica is `tp` GPUs holding one copy of the weights. A decode
step of B rows whose contexts sum to C tokens reads every weight once and
every cached key/value once:

    memory  = (weight_bytes + C * kv_bytes_per_token) / tp / (HBM bandwidth * memory_efficiency)
    compute = (2 * params * B + attention_flops_per_context_token * C) / tp / (peak bf16 * compute_efficiency)
    step    = max(memory, compute) + step_overhead + TP all-reduces

so a step of 4 rows costs about what a step of 256 costs while the weights
dominate (memory-bound decode), and long contexts make steps dearer. The TP
all-reduces are two per layer (attention and MLP outputs), B * hidden bf16
values each, priced by NCCL's own ring model (`comm.py`: a latency per ring
step by link, bandwidth by topology, NVLink within a node and the network
across), so their latency grows with TP. The KV budget of a replica is its
share of GPU memory less one copy of the weights, over the KV bytes a token
takes on it (KV heads are replicated when TP exceeds them). Each replica runs
at its slowest GPU's pace (`stragglers.py`). The trainer side (train step,
weight sync) is `trainer_cost.py`'s, here with the trainer on the same GPUs.

Every constant is chosen, not fitted (`efficiency.py` says where each comes
from; `presets.py` the hardware's and models').
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.sim.comm import collective_s
from tailflow.engines.sim.costs import CostModel, CostModelError, Infeasible
from tailflow.engines.sim.efficiency import Efficiency
from tailflow.engines.sim.presets import Hardware, ModelShape, hardware_preset, model_preset
from tailflow.engines.sim.stragglers import replica_slowdowns
from tailflow.engines.sim.trainer_cost import TrainerCost


@dataclass(frozen=True)
class ClusterShape:
    num_gpus: int
    tp: int
    """Tensor-parallel size of one rollout replica; num_gpus / tp replicas run side by side."""

    def __post_init__(self) -> None:
        if self.num_gpus < 1 or self.tp < 1 or self.num_gpus % self.tp:
            raise CostModelError(f"--gpus {self.num_gpus} must be a positive multiple of --tp {self.tp}")

    @property
    def num_replicas(self) -> int:
        return self.num_gpus // self.tp


def sum_linear(a: float, b: float, start: int, end: int) -> float:
    """sum of a + b*j for j in [start, end)."""
    n = end - start
    return n * a + b * (start + end - 1) * n / 2 if n > 0 else 0.0


def sum_max_linear(a1: float, b1: float, a2: float, b2: float, num_steps: int) -> float:
    """sum over j in [0, num_steps) of max(a1 + b1 j, a2 + b2 j), in closed form (the lines cross at most once)."""
    if b1 == b2:
        return sum_linear(max(a1, a2), b1, 0, num_steps)
    cross = (a2 - a1) / (b1 - b2)  # line 1 is above line 2 for j > cross iff b1 > b2
    split = min(max(int(cross) + 1, 0), num_steps) if cross >= 0 else 0
    below, above = ((a2, b2), (a1, b1)) if b1 > b2 else ((a1, b1), (a2, b2))
    return sum_linear(*below, 0, split) + sum_linear(*above, split, num_steps)


class RooflineCost(CostModel):
    def __init__(self, hardware: Hardware, model: ModelShape, cluster: ClusterShape,
                 efficiency: Efficiency = Efficiency()) -> None:
        self.hardware, self.model, self.cluster, self.efficiency = hardware, model, cluster, efficiency
        tp, e = cluster.tp, efficiency
        bandwidth = hardware.hbm_bytes_per_s * e.memory_efficiency * tp
        flops = hardware.bf16_flops * e.compute_efficiency * tp
        self._mem_fixed = model.weight_bytes / bandwidth
        self._mem_per_context = self.kv_bytes_per_token / bandwidth  # replicated KV heads are read too
        self._flops_per_row = 2.0 * model.num_params / flops
        self._flops_per_context = model.attention_flops_per_context_token / flops
        self._allreduce: dict[int, float] = {}
        """num_rows -> the all-reduces of a forward over them (decode asks the same few sizes again and again)."""

    @classmethod
    def from_presets(cls, hardware: str, model: str, num_gpus: int, tp: int,
                     efficiency: Efficiency = Efficiency()) -> "RooflineCost":
        return cls(hardware_preset(hardware), model_preset(model), ClusterShape(num_gpus, tp), efficiency)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes one token takes on a replica: the model's, times the replication when TP exceeds the KV heads
        (each GPU then holds a whole head)."""
        return self.model.kv_bytes_per_token * max(1.0, self.cluster.tp / self.model.num_kv_heads)

    @property
    def kv_budget_tokens(self) -> int:
        """KV-cache tokens one replica holds: its memory share less one copy of the weights."""
        usable = self.hardware.hbm_bytes * self.cluster.tp * self.efficiency.gpu_memory_utilization
        free = usable - self.model.weight_bytes
        if free <= 0:
            raise Infeasible(f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB of weights) does not fit "
                                 f"{self.cluster.tp} x {self.hardware.name}: raise --tp")
        return int(free // self.kv_bytes_per_token)

    def allreduce_s(self, num_rows: int) -> float:
        """The TP all-reduces of one forward over `num_rows` tokens: two a layer of rows x hidden bf16 values."""
        if self.cluster.tp == 1:
            return 0.0
        cached = self._allreduce.get(num_rows)
        if cached is None:
            message = num_rows * self.model.hidden_size * 2.0
            one = collective_s("all_reduce", message, self.cluster.tp, self.hardware.fabric)
            cached = self._allreduce[num_rows] = 2 * self.model.num_layers * one
        return cached

    def replica_slowdowns(self, num_replicas: int, seed: int = 0) -> list[float]:
        return replica_slowdowns(num_replicas, self.cluster.tp, self.efficiency.straggler_spread, seed)

    def decode_s(self, num_rows: int, context_tokens: int, max_context: int = 0) -> float:
        if num_rows == 0:
            return 0.0
        memory = self._mem_fixed + self._mem_per_context * context_tokens
        compute = self._flops_per_row * num_rows + self._flops_per_context * context_tokens
        return max(memory, compute) + self.efficiency.step_overhead_s + self.allreduce_s(num_rows)

    def decode_span_s(self, num_rows: int, context_tokens: int, max_context: int, num_steps: int) -> float:
        """Closed form: context grows by num_rows a step, so memory and compute time are lines in the step index.

        Paged attention reads each row's own context, so `max_context` plays no part here.
        """
        if num_rows == 0 or num_steps <= 0:
            return 0.0
        memory = (self._mem_fixed + self._mem_per_context * context_tokens, self._mem_per_context * num_rows)
        compute = (self._flops_per_row * num_rows + self._flops_per_context * context_tokens,
                   self._flops_per_context * num_rows)
        fixed = self.efficiency.step_overhead_s + self.allreduce_s(num_rows)
        return sum_max_linear(*memory, *compute, num_steps) + fixed * num_steps

    def prefill_s(self, num_tokens: int, num_seqs: int) -> float:
        """Compute-bound: 2 x params FLOPs a token (attention's quadratic part is left out: prompts are short)."""
        if num_tokens <= 0:
            return 0.0
        compute = self._flops_per_row * num_tokens
        return max(compute, self._mem_fixed) + self.efficiency.step_overhead_s + self.allreduce_s(num_tokens)

    @property
    def trainer(self) -> TrainerCost:
        """Training and the weight sync on this replica group's own GPUs (colocated)."""
        c = self.cluster
        return TrainerCost(self.hardware, self.model, self.efficiency, c.num_gpus, c.num_gpus, c.tp, colocated=True)

    def train_s(self, num_tokens: int) -> float:
        return self.trainer.train_s(num_tokens)

    def reward_s(self, num_responses: int, num_tokens: int) -> float:
        return self.trainer.reward_s(num_responses, num_tokens)

    def weight_sync_s(self) -> float:
        return self.trainer.weight_sync_s()

    def describe(self) -> str:
        c = self.cluster
        return (f"roofline: {self.model.name} on {c.num_gpus} x {self.hardware.name}, TP {c.tp} "
                f"({c.num_replicas} replicas, KV budget {self.kv_budget_tokens:,} tokens each)")
