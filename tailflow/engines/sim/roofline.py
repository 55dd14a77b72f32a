"""The `roofline` cost model: a GPU decode step from bytes moved and FLOPs done.

One rollout replica is `tp` GPUs holding one copy of the weights. A decode
step of B rows whose contexts sum to C tokens reads every weight once and
every cached key/value once:

    memory  = (weight_bytes + C * kv_bytes_per_token) / tp / (HBM bandwidth * memory_efficiency)
    compute = (2 * params * B + attention_flops_per_context_token * C) / tp / (peak bf16 * compute_efficiency)
    step    = max(memory, compute) + step_overhead + TP all-reduce

so a step of 4 rows costs about what a step of 256 costs while the weights
dominate (memory-bound decode), and long contexts make steps dearer. The TP
all-reduce is two per layer (attention and MLP outputs), B * hidden bf16 values
each, as a ring: 2 (tp-1)/tp of the message over NVLink plus a fixed latency.
Training is 6 x params x tokens (forward + backward), plus 2 x params x tokens
for each extra forward pass RL needs (reference model, old log-probs), over
all GPUs at `mfu` of peak.

Every efficiency constant below is chosen, not fitted: each says where its
value comes from. None was adjusted after comparing with the paper.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tailflow.engines.sim.costs import CostModel, CostModelError
from tailflow.engines.sim.presets import Hardware, ModelShape, hardware_preset, model_preset


@dataclass(frozen=True)
class Efficiency:
    memory_efficiency: float = 0.75
    """Achieved share of peak HBM bandwidth in decode: memory-bound GEMV kernels typically reach 70-85% of
    peak on H100-class parts (a round figure in that range, not a measurement of ours)."""
    compute_efficiency: float = 0.6
    """Achieved share of peak bf16 FLOP/s of decode and prefill GEMMs at these batch sizes (a round figure)."""
    step_overhead_s: float = 0.002
    """Fixed time per engine step outside the kernels (scheduling, sampling, launching a CUDA graph): of order
    1-3 ms in vLLM-class engines at a few hundred rows; 2 ms chosen."""
    allreduce_latency_s: float = 10e-6
    """Latency of one small NCCL all-reduce inside a node (order 10 us)."""
    mfu: float = 0.35
    """Model FLOP utilisation of training: Megatron-style dense training reaches ~40-45% on H100; RL training on
    variable-length packed batches does worse, so 35%."""
    extra_forward_passes: int = 2
    """Forward passes per trained token besides the policy's own forward + backward: the reference model
    (KL) and the old policy's log-probs, as GRPO-family trainers (veRL, ROLL) compute them."""
    gpu_memory_utilization: float = 0.85
    """Share of GPU memory the rollout engine may use for weights + KV cache (RollPacker's example config
    sets vLLM's gpu_memory_utilization to 0.85)."""

    def __post_init__(self) -> None:
        for name in ("memory_efficiency", "compute_efficiency", "mfu", "gpu_memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise CostModelError(f"efficiency {name} must be in (0, 1], got {getattr(self, name)}")


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
    name = "roofline"

    def __init__(self, hardware: Hardware, model: ModelShape, cluster: ClusterShape,
                 efficiency: Efficiency = Efficiency()) -> None:
        self.hardware, self.model, self.cluster, self.efficiency = hardware, model, cluster, efficiency
        tp, e = cluster.tp, efficiency
        bandwidth = hardware.hbm_bytes_per_s * e.memory_efficiency * tp
        flops = hardware.bf16_flops * e.compute_efficiency * tp
        self._mem_fixed = model.weight_bytes / bandwidth
        self._mem_per_context = model.kv_bytes_per_token / bandwidth
        self._flops_per_row = 2.0 * model.num_params / flops
        self._flops_per_context = model.attention_flops_per_context_token / flops

    @classmethod
    def from_presets(cls, hardware: str, model: str, num_gpus: int, tp: int,
                     efficiency: Efficiency = Efficiency()) -> "RooflineCost":
        return cls(hardware_preset(hardware), model_preset(model), ClusterShape(num_gpus, tp), efficiency)

    def with_tp(self, tp: int) -> "RooflineCost":
        return RooflineCost(self.hardware, self.model, replace(self.cluster, tp=tp), self.efficiency)

    @property
    def kv_budget_tokens(self) -> int:
        """KV-cache tokens one replica holds: its memory share less one copy of the weights."""
        usable = self.hardware.hbm_bytes * self.cluster.tp * self.efficiency.gpu_memory_utilization
        free = usable - self.model.weight_bytes
        if free <= 0:
            raise CostModelError(f"{self.model.name} ({self.model.weight_bytes / 1e9:.0f} GB of weights) does not fit "
                                 f"{self.cluster.tp} x {self.hardware.name}: raise --tp")
        return int(free // self.model.kv_bytes_per_token)

    def allreduce_s(self, num_rows: int) -> float:
        tp = self.cluster.tp
        if tp == 1:
            return 0.0
        message = num_rows * self.model.hidden_size * 2.0
        ring = 2.0 * (tp - 1) / tp * message / self.hardware.nvlink_bytes_per_s
        return 2 * self.model.num_layers * (ring + self.efficiency.allreduce_latency_s)

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

    def train_s(self, num_tokens: int) -> float:
        passes = 6.0 + 2.0 * self.efficiency.extra_forward_passes
        flops = passes * self.model.num_params * num_tokens
        return flops / (self.cluster.num_gpus * self.hardware.bf16_flops * self.efficiency.mfu)

    def reward_s(self, num_responses: int, num_tokens: int) -> float:
        """Not modelled on the roofline: rule-based and sandboxed rewards run on CPUs (see `StepShares`)."""
        return 0.0

    def weight_sync_s(self) -> float:
        """One copy of the weights over the inter-node network (a broadcast to every replica, pipelined)."""
        return self.model.weight_bytes / self.hardware.network_bytes_per_s

    def describe(self) -> str:
        c = self.cluster
        return (f"roofline: {self.model.name} on {c.num_gpus} x {self.hardware.name}, TP {c.tp} "
                f"({c.num_replicas} replicas, KV budget {self.kv_budget_tokens:,} tokens each)")
