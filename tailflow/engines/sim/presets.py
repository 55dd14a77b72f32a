"""Named hardware and model shapes for the roofline cost model.

Hardware figures are the vendors' datasheet numbers for the SXM parts (dense
bf16, no sparsity); model shapes are the `config.json` of each Hugging Face
checkpoint and the parameter counts of its model card. Nothing here was
fitted to any measurement: they are the inputs of a first-principles model.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.sim.comm import Fabric
from tailflow.engines.sim.costs import CostModelError


@dataclass(frozen=True)
class Hardware:
    name: str
    hbm_bytes: float
    """Memory per GPU."""
    hbm_bytes_per_s: float
    """Peak HBM bandwidth per GPU."""
    bf16_flops: float
    """Peak dense bf16 tensor-core FLOP/s per GPU."""
    nvlink_bytes_per_s: float
    """NVLink bandwidth per GPU, one direction (what a ring all-reduce step moves at)."""
    network_bytes_per_s: float
    """Inter-node bandwidth per GPU (InfiniBand), one direction; also what one node's NIC gives a transfer that
    runs over one network address (Ray's object store)."""
    pcie_bytes_per_s: float
    """Host-to-device copy bandwidth per GPU, one direction (loading weights from host memory)."""
    gpus_per_node: int = 8
    """GPUs sharing one NVLink domain (an HGX board)."""

    @property
    def fabric(self) -> Fabric:
        return Fabric(self.gpus_per_node, self.nvlink_bytes_per_s, self.network_bytes_per_s)


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def weight_bytes(self) -> float:
        """bf16 weights: 2 bytes a parameter."""
        return 2.0 * self.num_params

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of one token over all layers, bf16."""
        return 2.0 * 2.0 * self.num_layers * self.num_kv_heads * self.head_dim

    @property
    def attention_flops_per_context_token(self) -> float:
        """Decode attention FLOPs a new token spends per token of its context (QK^T and AV, all layers)."""
        return 4.0 * self.num_layers * self.num_heads * self.head_dim


HARDWARE = {
    # NVIDIA H100 SXM5 80GB datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16, NVLink 900 GB/s
    # (both directions), PCIe Gen5 128 GB/s (both directions); NDR InfiniBand 400 Gb/s per GPU.
    "h100": Hardware("h100", 80e9, 3.35e12, 989e12, 450e9, 50e9, 64e9),
    # H800 SXM5: the H100's memory, compute and PCIe, NVLink cut to 400 GB/s (both directions); the paper's
    # cluster has 400 Gb/s InfiniBand.
    "h800": Hardware("h800", 80e9, 3.35e12, 989e12, 200e9, 50e9, 64e9),
    # A100 SXM4 80GB datasheet: 2.039 TB/s HBM2e, 312 TFLOP/s dense bf16, NVLink 600 GB/s, PCIe Gen4 64 GB/s
    # (both directions); HDR 200 Gb/s.
    "a100": Hardware("a100", 80e9, 2.039e12, 312e12, 300e9, 25e9, 32e9),
}

MODELS = {
    # Qwen2.5 config.json (layers, hidden, heads, KV heads; head_dim = hidden / heads = 128) and the
    # model cards' parameter counts (7.61B, 14.7B, 32.5B).
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 7.61e9, 28, 3584, 28, 4, 128),
    "qwen2.5-14b": ModelShape("qwen2.5-14b", 14.7e9, 48, 5120, 40, 8, 128),
    "qwen2.5-32b": ModelShape("qwen2.5-32b", 32.5e9, 64, 5120, 40, 8, 128),
}


def hardware_preset(name: str) -> Hardware:
    try:
        return HARDWARE[name.lower()]
    except KeyError:
        raise CostModelError(f"--hardware: unknown preset {name!r}; known: {', '.join(HARDWARE)}") from None


def model_preset(name: str) -> ModelShape:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise CostModelError(f"--model: unknown preset {name!r}; known: {', '.join(MODELS)}") from None
