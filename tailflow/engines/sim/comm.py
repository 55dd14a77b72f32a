"""How long a collective takes: NCCL's own ring model, with its latency per step by link and its bandwidth by
topology (within a node over NVLink, across nodes over the network).

NCCL picks, per call, the fastest of its protocols from a cost model whose
constants NVIDIA measured (src/graph/tuning.cc, ring algorithm; read from NCCL
2.x, the values below are that file's): a call of `n` ranks takes

    base latency + steps x per-step latency  +  bytes / algorithm bandwidth

with `steps` = 2 (n - 1) for an all-reduce and n - 1 for an all-gather or a
reduce-scatter, algorithm bandwidth = bus bandwidth x n / steps, and two
protocols that matter here: LL (low latency: 6.6 us base, 0.47 us a step on
NVLink, 2.7 us on the network; a quarter of the bus bandwidth) and Simple
(8.4 us base, 3.4 us a step on NVLink, 9.6 us on the network; the full bus
bandwidth). Across nodes, NCCL counts 2 (nodes - 1) of the all-reduce's steps
at the network's latency and the rest at NVLink's (x 1.8 for LL), and the bus
bandwidth is the network's. The bus bandwidth is the hardware's per-GPU link
bandwidth in one direction (`presets.py`: datasheet figures), not a fit.

So a tensor-parallel decode step, two all-reduces a layer of a few kB to MB
each, pays mostly latency, and that latency grows with TP: the best TP
depends on the batch and the context, not only on memory.
"""
from __future__ import annotations

from dataclasses import dataclass

RING_BASE_S = {"ll": 6.6e-6, "simple": 8.4e-6}
"""NCCL tuning.cc baseLat, ring: LL 6.6 us, Simple 8.4 us."""
NVLINK_STEP_S = {"ll": 0.47e-6, "simple": 3.4e-6}
"""NCCL tuning.cc hwLat[NVLINK], ring: LL 0.47 us, Simple 3.4 us a step."""
NETWORK_STEP_S = {"ll": 2.7e-6, "simple": 9.6e-6}
"""NCCL tuning.cc hwLat[NET], ring: LL 2.7 us, Simple 9.6 us a step."""
LL_BANDWIDTH_SHARE = 0.25
"""NCCL tuning.cc: a ring all-reduce in LL gets a quarter of the bus bandwidth (its 8-byte lines carry 4 of data
and 4 of flags, and it runs fewer threads)."""
LL_MULTINODE_INTRA_FACTOR = 1.8
"""NCCL tuning.cc: LL's intra-node step latency x 1.8 when the ranks span nodes."""

STEPS_PER_RANK = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}


@dataclass(frozen=True)
class Fabric:
    """The links between one node's GPUs and between nodes, per GPU, one direction."""

    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float


def collective_s(kind: str, num_bytes: float, num_ranks: int, fabric: Fabric) -> float:
    """Seconds for one `kind` collective ("all_reduce", "all_gather", "reduce_scatter") over `num_ranks` GPUs of
    `num_bytes` (the whole buffer), packed onto as few nodes as they fit: the faster of NCCL's LL and Simple."""
    if num_ranks <= 1:
        return 0.0
    per_rank = STEPS_PER_RANK[kind]
    steps = per_rank * (num_ranks - 1)
    num_nodes = -(-num_ranks // fabric.gpus_per_node)
    inter_steps = per_rank * (num_nodes - 1)
    bus = fabric.network_bytes_per_s if num_nodes > 1 else fabric.nvlink_bytes_per_s
    times = []
    for protocol in ("ll", "simple"):
        intra = NVLINK_STEP_S[protocol] * (LL_MULTINODE_INTRA_FACTOR if protocol == "ll" and num_nodes > 1 else 1.0)
        latency = RING_BASE_S[protocol] + (steps - inter_steps) * intra + inter_steps * NETWORK_STEP_S[protocol]
        bandwidth = bus * (LL_BANDWIDTH_SHARE if protocol == "ll" else 1.0) * num_ranks / steps
        times.append(latency + num_bytes / bandwidth)
    return min(times)
