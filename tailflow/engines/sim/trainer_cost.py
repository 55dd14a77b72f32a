"""What the trainer side of a step costs on GPUs: the FSDP train step and the weight sync, as tailflow runs them.

**Train step** (`engines/train/trainer.py`: FSDP2 over the trainer's GPUs).
Compute is (6 + 2 x extra forward passes) x params x tokens FLOPs (forward +
backward, plus the reference model's and the old policy's forward passes)
over all GPUs at `mfu` of peak, at the pace of the slowest GPU
(`stragglers.expected_slowest`). Communication: FSDP shards every weight, so
each forward pass all-gathers the weights and the backward all-gathers them
again and reduce-scatters the gradients: (3 + extra forward passes)
collectives of the bf16 weights over all trainer GPUs a step (one gather per
pass: micro-batches that regather are not counted), NCCL's ring model
(`comm.py`), of which `dp_comm_overlap` is hidden behind compute. Its share
grows with the GPUs: compute shrinks as 1 / GPUs, the ring's bytes per GPU do
not.

**Weight sync** (`engines/cluster/weight_sync.py`): rank 0 gathers the full
weights (an all-gather over the trainer's GPUs), puts them once into Ray's
object store, and every rollout node pulls its own copy from there over one
network interface (`Hardware.network_bytes_per_s`), one node after another
through the source's interface (a node that already holds the copy, the
trainer's own when colocated, pulls nothing); each GPU then copies its 1/TP
share to the device over PCIe. So the sync grows with the rollout nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tailflow.engines.sim.comm import collective_s
from tailflow.engines.sim.efficiency import Efficiency
from tailflow.engines.sim.presets import Hardware, ModelShape
from tailflow.engines.sim.stragglers import expected_slowest


def weight_sync_s(model: ModelShape, hardware: Hardware, train_gpus: int, rollout_gpus: int, rollout_tp: int,
                  colocated: bool) -> float:
    gather = collective_s("all_gather", model.weight_bytes, train_gpus, hardware.fabric)
    rollout_nodes = math.ceil(rollout_gpus / hardware.gpus_per_node)
    pulls = rollout_nodes - 1 if colocated else rollout_nodes
    fan_out = pulls * model.weight_bytes / hardware.network_bytes_per_s
    load = model.weight_bytes / rollout_tp / hardware.pcie_bytes_per_s
    return gather + fan_out + load


@dataclass(frozen=True)
class TrainerCost:
    """The trainer side of a step on its own GPUs (or the rollout's, `colocated`): a `NonRolloutCost`."""

    hardware: Hardware
    model: ModelShape
    efficiency: Efficiency
    train_gpus: int
    rollout_gpus: int
    rollout_tp: int
    colocated: bool

    def train_s(self, num_tokens: int) -> float:
        """Compute over all trainer GPUs at the slowest one's pace, plus FSDP's exposed communication."""
        e, gpus = self.efficiency, self.train_gpus
        flops = (6.0 + 2.0 * e.extra_forward_passes) * self.model.num_params * num_tokens
        compute = flops / (gpus * self.hardware.bf16_flops * e.mfu) * expected_slowest(gpus, e.straggler_spread)
        one = collective_s("all_gather", self.model.weight_bytes, gpus, self.hardware.fabric)
        return compute + (3 + e.extra_forward_passes) * one * (1.0 - e.dp_comm_overlap)

    def reward_s(self, num_responses: int, num_tokens: int) -> float:
        """Not modelled here: rule-based and sandboxed rewards run on CPUs (`step_time.py`'s shares price them)."""
        return 0.0

    def weight_sync_s(self) -> float:
        return weight_sync_s(self.model, self.hardware, self.train_gpus, self.rollout_gpus, self.rollout_tp,
                             self.colocated)
