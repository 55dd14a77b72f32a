"""The `offload` stage: the trainer's offload and reload, the blocking way beside the staged (pinned) way.

On the H200 (turns stage) the blocking offload of one unsharded Qwen2.5-0.5B
trainer (weights and AdamW state, 5,661 MiB) took 12.0 s, about 0.5 GB/s.
`PolicyTrainer.offload` now moves through `host_moves.StagedMoves` on CUDA
(every copy issued into pinned memory, one wait, then swapped in). This stage
builds that trainer again, takes one step (so AdamW's state exists), and for
each way, twice (the first staged offload pins its host memory; the second
reuses torch's cached pinned blocks): the offload's and the reload's seconds,
GB/s, the device memory the offload gave back, and whether the state after
the round trip equals the state before, bit for bit.

Beside it, raw copies of one buffer (`buffer_bytes`), to tell what the machine
can do from what the trainer gets: device to host into fresh pageable memory
(what the blocking way does), into pageable memory touched beforehand (if
this is much faster, page faults on fresh memory were the cost), into
preallocated pinned memory, non-blocking (torch's cached pinned blocks), the
cost of pinning that much host memory, and host to device from pageable and
from pinned memory.

On a CPU (the dry run) the blocking way copies nothing; the staged way runs
with `copy=clone` so its swap is exercised and timed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tailflow.engines.train.host_moves import BlockingMoves, StagedMoves, optimizer_tensors


@dataclass(frozen=True)
class MoveRound:
    way: str
    round: int
    gigabytes: float
    offload_s: float
    reload_s: float
    freed_mib: float | None
    """Device memory the offload gave back (None on a CPU)."""
    exact: bool
    """Every parameter, buffer and AdamW tensor after offload + reload equals its value before, bit for bit."""

    @property
    def offload_gb_s(self) -> float:
        return self.gigabytes / self.offload_s if self.offload_s > 0 else float("inf")

    @property
    def reload_gb_s(self) -> float:
        return self.gigabytes / self.reload_s if self.reload_s > 0 else float("inf")


@dataclass(frozen=True)
class RawCopy:
    what: str
    gigabytes: float
    seconds: float

    @property
    def gb_s(self) -> float:
        return self.gigabytes / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class OffloadResult:
    device: str
    rounds: list[MoveRound] = field(default_factory=list)
    raw: list[RawCopy] = field(default_factory=list)

    def describe(self) -> list[str]:
        lines = [f"{'way':<26}{'round':>6}{'GB':>7}{'offload s':>11}{'GB/s':>8}{'reload s':>10}{'GB/s':>8}"
                 f"{'MiB freed':>10}{'exact':>7}"]
        for r in self.rounds:
            freed = "-" if r.freed_mib is None else f"{r.freed_mib:.0f}"
            lines.append(f"{r.way:<26}{r.round:>6}{r.gigabytes:7.2f}{r.offload_s:11.3f}{r.offload_gb_s:8.2f}"
                         f"{r.reload_s:10.3f}{r.reload_gb_s:8.2f}{freed:>10}{str(r.exact):>7}")
        for c in self.raw:
            lines.append(f"raw: {c.what:<44} {c.gigabytes:6.2f} GB {c.seconds:8.3f} s {c.gb_s:8.2f} GB/s")
        return lines


def state_tensors(trainer) -> list[torch.Tensor]:
    """What an offload moves, in a fixed order: parameters and buffers of the policy (and reference), then
    AdamW's tensors."""
    found = []
    for module in (trainer.model, trainer.ref_model):
        if module is not None:
            found.extend(module.parameters())
            found.extend(module.buffers())
    found.extend(value for _, _, value in optimizer_tensors(trainer.optimizer))
    return found


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), else the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def gigabytes(tensors: list[torch.Tensor]) -> float:
    return sum(local(t).numel() * local(t).element_size() for t in tensors) / 1e9


def measure_round(trainer, way: str, moves, round_: int, synchronize) -> MoveRound:
    before = [local(t).detach().clone() for t in state_tensors(trainer)]
    size = gigabytes(state_tensors(trainer))
    trainer.host_moves = moves
    cuda = trainer.device.type == "cuda"
    synchronize()
    allocated = torch.cuda.memory_allocated(trainer.device) if cuda else 0
    started = time.perf_counter()
    trainer.offload()
    synchronize()
    offload_s = time.perf_counter() - started
    freed = (allocated - torch.cuda.memory_allocated(trainer.device)) / 2**20 if cuda else None
    started = time.perf_counter()
    trainer.reload()
    synchronize()
    reload_s = time.perf_counter() - started
    after = [local(t).detach() for t in state_tensors(trainer)]
    exact = len(before) == len(after) and all(a.device == b.device and torch.equal(a, b)
                                              for a, b in zip(before, after))
    del before
    return MoveRound(way, round_, size, offload_s, reload_s, freed, exact)


def raw_copies(device: str, nbytes: int, synchronize) -> list[RawCopy]:
    """One buffer of `nbytes` moved the ways the module docstring lists."""
    size = nbytes / 1e9
    source = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    cuda = torch.device(device).type == "cuda"
    out = []

    def timed(what: str, action) -> torch.Tensor | None:
        synchronize()
        started = time.perf_counter()
        value = action()
        synchronize()
        out.append(RawCopy(what, size, time.perf_counter() - started))
        return value

    timed("device -> host, fresh pageable (blocking .to)", lambda: source.to("cpu"))
    touched = torch.ones(nbytes, dtype=torch.uint8)
    timed("device -> host, pre-touched pageable", lambda: touched.copy_(source))
    pinned = timed("pin host memory (allocation alone)",
                   lambda: torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda))
    timed("device -> host, preallocated pinned", lambda: pinned.copy_(source, non_blocking=cuda))
    first = timed("device -> host, non-blocking .to (1st)", lambda: source.to("cpu", non_blocking=cuda))
    del first  # its pinned block goes back to torch's host cache
    timed("device -> host, non-blocking .to (2nd)", lambda: source.to("cpu", non_blocking=cuda))
    timed("host -> device, from pageable", lambda: touched.to(device))
    timed("host -> device, from pinned", lambda: pinned.to(device, non_blocking=cuda))
    return out


def empty_host_cache() -> None:
    """Give torch's cached pinned host blocks back (a private torch call; absent, nothing is done), so the
    trainer's first staged offload pays its pinning as a run's first offload does."""
    release = getattr(torch._C, "_host_emptyCache", None)
    if release is not None:
        release()


def measure_offload(trainer, samples, num_tokens: int, buffer_bytes: int, synchronize) -> OffloadResult:
    """`trainer`: a fresh `PolicyTrainer`; one step is taken here first. The raw copies run first (their pinning
    measured on fresh memory), then the host cache is emptied for the trainer's rounds."""
    trainer.train_step(samples, num_tokens)
    synchronize()
    result = OffloadResult(str(trainer.device))
    result.raw = raw_copies(str(trainer.device), buffer_bytes, synchronize)
    empty_host_cache()
    cuda = trainer.device.type == "cuda"
    staged = StagedMoves() if cuda else StagedMoves(copy=torch.Tensor.clone)
    ways = [("blocking (before)", BlockingMoves()),
            ("staged pinned" if cuda else "staged (cpu: clone)", staged)]
    for name, moves in ways:
        for round_ in (1, 2):
            result.rounds.append(measure_round(trainer, name, moves, round_, synchronize))
    return result
