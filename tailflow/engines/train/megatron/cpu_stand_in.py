"""A stand-in for the CUDA that megatron-core 0.16.1 assumes, used only where no GPU exists.

megatron-core builds on the CPU (`use_cpu_initialization`), but its forward
allocates with a hard-coded `torch.cuda.current_device()` (the rotary
embedding's frequencies, the global memory buffer of the attention scores,
the tensor-parallel gather of the logits) and forks a CUDA random-number
tracker around the attention dropout. On a CPU-only machine (this one, CI)
the stand-in makes those two things work on the CPU:

* `torch.cuda.current_device` answers "cpu". Where no GPU exists the real
  function can only raise, so nothing that worked changes; the device is only
  a place to allocate.
* megatron's own no-op random tracker (the one it builds for inference: its
  `fork` does nothing). The trainer's Megatron models have every dropout at
  0, so no random number is ever drawn inside a fork: skipping the CUDA
  state swap changes no result.

It is named as a stand-in, applies only when the trainer computes on a CPU of
a machine without a GPU (`applies`), and a run on a GPU never calls
`install`. Like `TAILFLOW_CUDA_STAND_IN` (engines/cluster/placement.py) it
exists only because this machine lacks the device.
"""
from __future__ import annotations

import torch

STAND_IN_MARK = "_tailflow_cpu_stand_in"


def applies(device_type: str, cuda_available: bool) -> bool:
    """Whether the Megatron backend needs the stand-in: the trainer computes on the CPU and no GPU exists. On a
    GPU (`cuda`) never. On the CPU of a machine WITH a GPU megatron-core would put its buffers on that GPU
    beside CPU weights: refused, with what to do instead."""
    if device_type == "cuda":
        return False
    if device_type != "cpu":
        raise ValueError(f"train.backend megatron runs on cuda or cpu, not {device_type!r}")
    if cuda_available:
        raise RuntimeError("train.backend megatron on the CPU of a machine with a GPU: megatron-core would allocate "
                           "its buffers on the GPU; use cluster.device gpu (unset TAILFLOW_CUDA_STAND_IN)")
    return True


def install_if_needed(device: torch.device) -> bool:
    """Install the stand-in where `applies` says so (idempotent); whether it is in place. Call after megatron's
    model-parallel state is initialised and before the first model is built."""
    if not applies(device.type, torch.cuda.is_available()):
        return False
    from megatron.core.tensor_parallel import random as megatron_random

    if not getattr(torch.cuda.current_device, STAND_IN_MARK, False):
        def current_device() -> str:
            return "cpu"

        setattr(current_device, STAND_IN_MARK, True)
        torch.cuda.current_device = current_device
    megatron_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    return True


def is_installed() -> bool:
    return bool(getattr(torch.cuda.current_device, STAND_IN_MARK, False))
