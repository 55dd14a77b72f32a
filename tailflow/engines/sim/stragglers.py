"""Replica stragglers: a round ends when its slowest replica does, and replicas are not equally fast.

GPUs of one SKU differ: each GPU's slowdown is drawn uniformly in
[1, 1 + spread] (`Efficiency.straggler_spread`, with its source); a rollout
replica of `tp` GPUs runs at its slowest GPU's pace (every layer ends in an
all-reduce that waits for all of them), and so does a synchronous data-parallel
train step over all its GPUs. The more replicas, the slower the slowest: the
expected slowest of n uniform draws is 1 + spread x n / (n + 1).
"""
from __future__ import annotations

from tailflow.engines.sim.lengths import seeded_rng


def replica_slowdowns(num_replicas: int, tp: int, spread: float, seed: int = 0) -> list[float]:
    """Per replica, the slowest of its `tp` GPUs' slowdowns (seeded: the same cluster every time)."""
    rng = seeded_rng("stragglers", seed, num_replicas, tp)
    return [max(1.0 + spread * rng.random() for _ in range(tp)) for _ in range(num_replicas)]


def expected_slowest(num_gpus: int, spread: float) -> float:
    """E[max of `num_gpus` draws uniform in [1, 1 + spread]]: what a step synchronised over them runs at."""
    return 1.0 + spread * num_gpus / (num_gpus + 1)
