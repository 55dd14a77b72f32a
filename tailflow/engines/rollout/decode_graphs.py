"""The decode step at a few fixed shapes, captured as CUDA graphs on a GPU (the way nano-vllm does it).

A decode step of a small model is hundreds of tiny kernel launches; on a GPU
the launches, not the arithmetic, set its time. A CUDA graph records them once
and replays them with one call, but only for fixed shapes and fixed buffers.
So the step is padded to a *bucket*: the running rows B round up to the next
batch bucket (1, 2, 4, 8, 16, 32, 64, 128, 256, capped at the slot count), and
the key length up to the next power of two (at least 256, capped at the
cache's length). Padded rows read token 0 at the scratch position (the
cache's last, which no request ever feeds) of free slots: running rows are
always slots 0..B-1, so they touch nothing a request owns, and their logits
are dropped.

Selecting buckets and padding is plain Python and runs on CPU too
(`capture=False`: the padded step runs eagerly there, which is how the tests
check that padding changes nothing). Only `capture=True` on a CUDA device uses
`torch.cuda.CUDAGraph`; graphs are captured lazily, on a shape's first use,
into one shared memory pool, and dropped when the weights change or the engine sleeps.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_KEY_BUCKET = 256


def batch_buckets(num_slots: int) -> tuple[int, ...]:
    """The row counts graphs are captured for: BATCH_BUCKETS below `num_slots`, then `num_slots` itself."""
    return tuple(b for b in BATCH_BUCKETS if b < num_slots) + (num_slots,)


def bucket_for(value: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= value; a value past the largest bucket is refused (a caller's bug)."""
    index = bisect.bisect_left(buckets, value)
    if value < 1 or index == len(buckets):
        raise ValueError(f"no bucket for {value} in {buckets}")
    return buckets[index]


def key_bucket(max_len: int, max_seq_len: int) -> int:
    """Keys read for a step whose longest row is `max_len`: the next power of two >= max(max_len, 256),
    at most `max_seq_len` (reading more keys costs bandwidth; fewer buckets cost more graphs)."""
    if not 1 <= max_len <= max_seq_len:
        raise ValueError(f"max_len {max_len} outside [1, {max_seq_len}]")
    return min(max(MIN_KEY_BUCKET, 1 << (max_len - 1).bit_length()), max_seq_len)


@dataclass
class CapturedStep:
    """One captured shape: the static input buffers the graph reads and the logits buffer it writes."""

    graph: "torch.cuda.CUDAGraph"
    token_ids: torch.Tensor  # [bucket] long
    positions: torch.Tensor  # [bucket] long
    logits: torch.Tensor     # [bucket, vocab]


class DecodeGraphs:
    """Runs `runner.decode_rows` at bucket shapes: replaying captured graphs, or eagerly (`capture=False`)."""

    def __init__(self, runner, capture: bool) -> None:
        if capture and not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device; use capture=False (eager buckets) on CPU")
        self.runner = runner
        self.buckets = batch_buckets(runner.num_slots)
        self.scratch_position = runner.max_seq_len - 1
        self.capture = capture
        self.captured: dict[tuple[int, int], CapturedStep] = {}
        self.pool = None

    def clear(self) -> None:
        """Drop every captured graph and their memory pool (freed once no graph uses it); the next capture
        starts a new pool. Called when the weights change (graphs read the old fused tensors) and on sleep."""
        self.captured.clear()
        self.pool = None

    def padded(self, token_ids: torch.Tensor, positions: torch.Tensor, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows padded to `bucket`: token 0 at the scratch position."""
        extra = bucket - token_ids.shape[0]
        if extra == 0:
            return token_ids, positions
        return (torch.cat([token_ids, token_ids.new_zeros(extra)]),
                torch.cat([positions, positions.new_full((extra,), self.scratch_position)]))

    def run(self, token_ids: torch.Tensor, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        """Logits [B, vocab] of the B real rows."""
        num_rows = token_ids.shape[0]
        bucket = bucket_for(num_rows, self.buckets)
        key_len = key_bucket(max_len, self.runner.max_seq_len)
        tokens, where = self.padded(token_ids, positions, bucket)
        if not self.capture:
            return self.runner.decode_rows(tokens, where, key_len)[:num_rows]
        step = self.captured.get((bucket, key_len)) or self._capture(bucket, key_len)
        step.token_ids.copy_(tokens)
        step.positions.copy_(where)
        step.graph.replay()
        return step.logits[:num_rows]

    def _capture(self, bucket: int, key_len: int) -> CapturedStep:
        """Warm up on a side stream (first calls allocate and pick kernels), then capture one step.

        The static inputs point at the scratch position, so the warm-up's cache writes land where no
        request reads."""
        device = self.runner.device
        token_ids = torch.zeros(bucket, dtype=torch.long, device=device)
        positions = torch.full((bucket,), self.scratch_position, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.runner.decode_rows(token_ids, positions, key_len)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.runner.decode_rows(token_ids, positions, key_len)
        self.pool = graph.pool()
        step = CapturedStep(graph, token_ids, positions, logits)
        self.captured[(bucket, key_len)] = step
        return step
