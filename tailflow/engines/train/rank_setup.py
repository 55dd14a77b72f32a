"""What every trainer rank's model wrapper does the same way: join the process group, copy state out.

(Kept apart from `policy_model.py`, which builds the wrappers that import these.)
"""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def init_process_group(dist_backend: str, rank: int, world_size: int, always: bool = False) -> torch.device:
    """This rank's device, after joining the process group (env MASTER_ADDR / MASTER_PORT, set by
    TrainerGroup). One process makes no group unless `always` (megatron-core needs one even alone: then a
    group of one on a free local port, where no MASTER_ADDR is set)."""
    if dist_backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if (world_size > 1 or always) and not dist.is_initialized():
        if world_size == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(dist_backend, rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
        else:
            dist.init_process_group(dist_backend, rank=rank, world_size=world_size)
    return device


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` now (the caller binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def replace_with_copies(tree):
    """Replace every tensor in nested dicts / lists by a detached copy, in place (one extra tensor at a time)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for key, value in list(items):
        tree[key] = value.detach().clone() if isinstance(value, torch.Tensor) else replace_with_copies(value)
    return tree
