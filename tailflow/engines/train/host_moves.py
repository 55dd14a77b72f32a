"""How a trainer rank's weights and AdamW state move between its GPU and host memory (`PolicyTrainer.offload`).

Two ways, one interface (`HostMoves`):

* `BlockingMoves`, the first way (and still the one on a CPU): `module.to(device)` and `tensor.to(device)`, one
  blocking copy per tensor into fresh pageable host memory. On an H200 (the kit's turns stage, one unsharded
  Qwen2.5-0.5B-shape trainer) it offloaded 5,661 MiB in 12.0 s, about 0.5 GB/s.
* `StagedMoves`, used on CUDA: first every tensor's host copy is *issued* (`copy`, by default a non-blocking
  `.to("cpu")`, whose destination torch allocates in pinned memory from its caching host allocator, which keeps
  the blocks for the next offload), then one wait for all of them, and only then are the copies put in place
  of the device tensors. The two phases matter under FSDP2: its `_apply` (behind `module.to`) reads the new
  host tensor at once to pad a shard (`FSDPParam.reset_sharded_param`), which must not happen while the copy
  into it is still in flight. Back to the device, every copy is issued non-blocking (stream-ordered before any
  use of the tensor there) and waited for once.

Both keep what the optimizer relies on: each parameter stays the same Parameter object (`.data` set, or
`torch.utils.swap_tensors` for FSDP2's DTensors, as `module._apply` decides), so AdamW's state, keyed by
parameter, stays valid; tied weights stay one parameter. Pinned host memory stays held by torch's caching host
allocator between offloads (that is what makes the second offload fast; blocks are rounded up to a power of
two, so up to twice the state's bytes). Neither has run on a GPU in this form yet (docs/gpu.md).

On a CPU the device is host memory and the trainer keeps `BlockingMoves`, whose moves hand back the tensors
themselves: nothing is copied and no result changes. The tests run `StagedMoves` on a CPU with `copy=clone`
to check that the swap loses nothing (everything but the pinning and the asynchrony).
"""
from __future__ import annotations

from typing import Callable, Iterable, Protocol

import torch

HostCopy = Callable[[torch.Tensor], torch.Tensor]


class HostMoves(Protocol):
    """Moves `modules` (None entries skipped) and the optimizer's tensors (not its `step`) as a whole."""

    def to_host(self, modules: Iterable[torch.nn.Module | None], optimizer: torch.optim.Optimizer) -> None: ...

    def to_device(self, modules: Iterable[torch.nn.Module | None], optimizer: torch.optim.Optimizer,
                  device: torch.device) -> None: ...


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterable[tuple[dict, str, torch.Tensor]]:
    """(state dict, key, tensor) of every optimizer state tensor but `step` (which torch keeps where it likes)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor):
                yield state, key, value


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class BlockingMoves:
    """One blocking `.to` per module and per optimizer tensor (the trainer's first offload, kept for CPUs and as
    the kit's baseline)."""

    def to_host(self, modules, optimizer) -> None:
        self._move(modules, optimizer, torch.device("cpu"))

    def to_device(self, modules, optimizer, device: torch.device) -> None:
        self._move(modules, optimizer, device)

    @staticmethod
    @torch.no_grad()
    def _move(modules, optimizer, device: torch.device) -> None:
        for module in modules:
            if module is not None:
                module.to(device)
        for state, key, value in list(optimizer_tensors(optimizer)):
            state[key] = value.to(device)


def non_blocking_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A device tensor's host copy, issued and maybe still in flight; pinned when it comes from CUDA."""
    return tensor.to("cpu", non_blocking=True)


def reshard_fsdp(module: torch.nn.Module) -> None:
    """Every FSDP2 module in `module` re-registers its sharded parameters, as its `_apply` does first: so the
    tensors collected next are the ones `_apply` will visit."""
    from torch.distributed.fsdp import FSDPModule

    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            sub.reshard()


class StagedMoves:
    """Issue every copy, wait once, then put the copies in place (module docstring). `copy` makes a tensor's
    host copy (default: non-blocking into pinned memory); the wait is on every device a tensor came from."""

    def __init__(self, copy: HostCopy = non_blocking_to_host) -> None:
        self.copy = copy

    @torch.no_grad()
    def to_host(self, modules, optimizer) -> None:
        modules = [m for m in modules if m is not None]
        for module in modules:
            reshard_fsdp(module)
        copies: dict[int, torch.Tensor] = {}
        sources = []  # the tensors copied, kept alive so no id() is reused while `copies` is read
        devices = set()
        for tensor in [*self._module_tensors(modules), *(value for _, _, value in optimizer_tensors(optimizer))]:
            if id(tensor) not in copies:
                copies[id(tensor)] = self.copy(tensor)
                sources.append(tensor)
                devices.add(tensor.device)
        for device in devices:
            synchronize(device)  # every copy landed before anything reads one
        for module in modules:
            module._apply(lambda t: copies.get(id(t), t))  # what `module.to` runs, with the copies ready
        for state, key, value in list(optimizer_tensors(optimizer)):
            state[key] = copies[id(value)]

    @torch.no_grad()
    def to_device(self, modules, optimizer, device: torch.device) -> None:
        non_blocking = device.type == "cuda"
        for module in modules:
            if module is not None:
                module.to(device, non_blocking=non_blocking)
        for state, key, value in list(optimizer_tensors(optimizer)):
            state[key] = value.to(device, non_blocking=non_blocking)
        synchronize(device)

    @staticmethod
    def _module_tensors(modules: list[torch.nn.Module]) -> list[torch.Tensor]:
        """Parameters and buffers, each once (a tied weight is one parameter)."""
        found = []
        for module in modules:
            found.extend(module.parameters())
            found.extend(b for b in module.buffers() if b is not None)
        return found


def moves_for(device: torch.device) -> HostMoves:
    """`StagedMoves` (pinned, one wait) on CUDA; `BlockingMoves` elsewhere, where moves copy nothing."""
    return StagedMoves() if device.type == "cuda" else BlockingMoves()
