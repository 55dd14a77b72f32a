"""The chosen physical constants of the `roofline` model, each with where its value comes from.

None was fitted to a result: the first five came with the roofline and have
not changed since; the rest came with the terms they price (scale: stragglers,
data-parallel communication) and were set from their sources before any
simulation with them ran. `bench/sim_validate.py` prints how every prediction
moves when each is changed by +-30% (bench/research/sensitivity.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.sim.costs import CostModelError


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
    mfu: float = 0.35
    """Model FLOP utilisation of training: Megatron-style dense training reaches ~40-45% on H100; RL training on
    variable-length packed batches does worse, so 35%."""
    gpu_memory_utilization: float = 0.85
    """Share of GPU memory the rollout engine may use for weights + KV cache (RollPacker's example config
    sets vLLM's gpu_memory_utilization to 0.85)."""
    straggler_spread: float = 0.08
    """How much slower the slowest GPU of a cluster runs the same kernels than the fastest: Sinha et al.,
    "Not All GPUs Are Created Equal" (SC'22, arXiv 2208.11035), measured an average performance variation of
    8% across the GPUs of one SKU in large clusters. Each GPU's slowdown is drawn uniformly in
    [1, 1 + spread]; a replica or a data-parallel step runs at its slowest GPU's pace."""
    dp_comm_overlap: float = 0.0
    """Share of the trainer's FSDP all-gathers and reduce-scatters hidden behind its compute. 0: none, an upper
    bound on train time (FSDP2 prefetches the next layer's all-gather, so some is hidden; not measured here)."""
    extra_forward_passes: int = 2
    """Forward passes per trained token besides the policy's own forward + backward: the reference model
    (KL) and the old policy's log-probs, as GRPO-family trainers (veRL, ROLL) compute them."""

    def __post_init__(self) -> None:
        for name in ("memory_efficiency", "compute_efficiency", "mfu", "gpu_memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise CostModelError(f"efficiency {name} must be in (0, 1], got {getattr(self, name)}")
        if not 0 <= self.dp_comm_overlap <= 1 or self.straggler_spread < 0 or self.step_overhead_s < 0:
            raise CostModelError("efficiency: dp_comm_overlap must be in [0, 1], straggler_spread and "
                                 "step_overhead_s >= 0")
