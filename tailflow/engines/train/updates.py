"""How a step's batch becomes optimizer updates: `train.ppo_epochs` passes over `train.mini_batches` parts.

The batch is cut into `mini_batches` parts of equal size (to one sample) and
each part is one optimizer update; this repeats `ppo_epochs` times, each
epoch with its own seeded shuffle (the same seed, epoch and batch give the
same parts). A sample stays on the rank it was sharded to, so its proximal
("old") log-probs, computed once on that rank before the first update, are
at hand in every epoch.

Loss normalisation per update: the loss of an update divides by ITS
mini-batch's global counts (response tokens and sequences over all ranks,
zero-advantage samples left out of the forward included), as a step divides
by the whole batch's: every update is a full step on a smaller batch.

Samples skipped for zero advantage (`train.skip_zero_advantage`) are spread
over the parts like the others; they only count in the divisors.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from tailflow.engines.train.batch import TrainSample, count_response_tokens


@dataclass(frozen=True)
class Update:
    """One optimizer update as one rank sees it."""

    indices: tuple[int, ...]
    """The rank's samples (indices into its shard) this update trains."""
    num_tokens: int
    """The model's response tokens (`count_response_tokens`: environment tokens excluded) of the update's whole
    mini-batch, all ranks, skipped samples included."""
    num_sequences: int
    """Samples of the update's whole mini-batch, all ranks, skipped samples included."""
    num_metric_tokens: int
    """Response tokens trained in this update on all ranks (the divisor of the reported token means)."""


def equal_parts(items: Sequence, num_parts: int) -> list[list]:
    """`items` cut in order into `num_parts` runs whose sizes differ by at most one."""
    size = len(items)
    return [list(items[part * size // num_parts:(part + 1) * size // num_parts]) for part in range(num_parts)]


def plan_updates(shards: Sequence[Sequence[TrainSample]], skipped: Sequence[TrainSample], ppo_epochs: int = 1,
                 mini_batches: int = 1, seed: int = 0) -> list[list[Update]]:
    """[rank][update]: every rank gets the same number of updates (ppo_epochs * mini_batches), so the ranks run
    matching collectives. `shards` are the ranks' trained samples, `skipped` the batch's samples left out of
    the forward (counted only)."""
    if ppo_epochs < 1 or mini_batches < 1:
        raise ValueError(f"ppo_epochs ({ppo_epochs}) and mini_batches ({mini_batches}) must both be >= 1")
    entries = [(rank, index) for rank, shard in enumerate(shards) for index in range(len(shard))]
    entries += [(-1, index) for index in range(len(skipped))]
    if mini_batches > len(entries):
        raise ValueError(f"train.mini_batches ({mini_batches}) is more than the step's {len(entries)} samples")
    plans: list[list[Update]] = [[] for _ in shards]
    for epoch in range(ppo_epochs):
        order = list(entries)
        random.Random(f"{seed}:{epoch}").shuffle(order)
        for part in equal_parts(order, mini_batches):
            trained = [shards[rank][index] for rank, index in part if rank >= 0]
            left_out = [skipped[index] for rank, index in part if rank < 0]
            num_metric_tokens = count_response_tokens(trained)
            num_tokens = num_metric_tokens + count_response_tokens(left_out)
            for rank, plan in enumerate(plans):
                indices = tuple(sorted(index for owner, index in part if owner == rank))
                plan.append(Update(indices, num_tokens, len(part), num_metric_tokens))
    return plans
