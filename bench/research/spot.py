"""Tokens per dollar of a schedule of rollout workers, on demand or on spot (issue 17).

A schedule is a list of intervals, each `hours` long with `num_workers`
workers (e.g. FluidRL's workers joining one at a time, 1 -> 4). On demand,
an interval produces throughput(n) x its seconds and costs n x hours x the
on-demand price. On spot, each worker is preempted `preemptions_per_hour`
times an hour while up and is replaced `replacement_s` later, so a worker is
up a share A = 1 / (1 + rate x replacement_h) of the time (an alternating
up/down renewal process), the n workers are up independently, and an
interval's expected throughput is sum_k C(n, k) A^k (1 - A)^(n - k)
throughput(k). Each preemption (n x hours x rate x A of them) also throws
away what its worker did since its last poll (`poll_interval_s` of its share
of the throughput) and the time spent prefilling its in-flight responses
again where they continue (`reprefill_s`). Spot workers are billed for the
whole schedule, the replacement's start-up included.

Where `throughput` comes from is the caller's choice: `simulated_workers`
gives the simulator's rollout model, or a table of reported figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

FLUIDRL_ON_DEMAND_PER_HOUR = 83.79
FLUIDRL_SPOT_PER_HOUR = 21.28
"""FluidRL's reproduce guide's prices for one H100 x 8 worker an hour, on demand and spot."""


@dataclass(frozen=True)
class Interval:
    hours: float
    num_workers: int


@dataclass(frozen=True)
class SpotTerms:
    on_demand_per_hour: float
    """Price of one worker an hour on demand (FluidRL: $83.79 for an H100 x 8)."""
    spot_per_hour: float
    """...and on spot ($21.28)."""
    preemptions_per_hour: float
    """Per spot worker, while it is up."""
    replacement_s: float = 300.0
    """From a preemption until a replacement worker has joined and loaded the weights."""
    poll_interval_s: float = 1.0
    """At most this much of a preempted worker's generation is lost (since its last poll)."""

    def __post_init__(self) -> None:
        if min(self.on_demand_per_hour, self.spot_per_hour) <= 0:
            raise ValueError("prices must be > 0")
        if self.preemptions_per_hour < 0 or self.replacement_s < 0 or self.poll_interval_s < 0:
            raise ValueError("preemption rate, replacement time and poll interval must be >= 0")

    @property
    def availability(self) -> float:
        """Share of the time a spot worker is up."""
        return 1.0 / (1.0 + self.preemptions_per_hour * self.replacement_s / 3600.0)


@dataclass(frozen=True)
class WorkerModel:
    throughput: Mapping[int, float]
    """Generated tokens per second with k workers up, for k = 1..max (0 workers: 0)."""
    reprefill_s: float = 0.0
    """Worker-seconds to prefill a preempted worker's in-flight prompts and partial responses again."""
    source: str = ""

    def tokens_per_s(self, num_workers: int) -> float:
        return 0.0 if num_workers == 0 else self.throughput[num_workers]


@dataclass(frozen=True)
class ScheduleCost:
    hours: float
    tokens_on_demand: float
    dollars_on_demand: float
    tokens_spot: float
    dollars_spot: float
    preemptions: float
    """Expected number over the schedule."""
    tokens_lost: float
    """tokens_on_demand - tokens_spot: workers down, generation since the last poll, re-prefill."""

    @property
    def tokens_per_dollar_on_demand(self) -> float:
        return self.tokens_on_demand / self.dollars_on_demand

    @property
    def tokens_per_dollar_spot(self) -> float:
        return self.tokens_spot / self.dollars_spot

    @property
    def tokens_per_s_on_demand(self) -> float:
        return self.tokens_on_demand / (self.hours * 3600.0)

    @property
    def tokens_per_s_spot(self) -> float:
        return self.tokens_spot / (self.hours * 3600.0)


def expected_throughput(workers: WorkerModel, num_workers: int, availability: float) -> float:
    """Mean tokens/s of `num_workers` spot workers, each up with probability `availability`, independently."""
    return sum(math.comb(num_workers, k) * availability ** k * (1 - availability) ** (num_workers - k)
               * workers.tokens_per_s(k) for k in range(num_workers + 1))


def schedule_cost(schedule: Sequence[Interval], workers: WorkerModel, terms: SpotTerms) -> ScheduleCost:
    tokens_od = tokens_spot = dollars_od = dollars_spot = preemptions = 0.0
    for interval in schedule:
        n, seconds = interval.num_workers, interval.hours * 3600.0
        tokens_od += workers.tokens_per_s(n) * seconds
        dollars_od += n * interval.hours * terms.on_demand_per_hour
        dollars_spot += n * interval.hours * terms.spot_per_hour
        interval_preemptions = n * interval.hours * terms.preemptions_per_hour * terms.availability
        per_worker = workers.tokens_per_s(n) / n if n else 0.0
        regenerated = interval_preemptions * per_worker * (terms.poll_interval_s + workers.reprefill_s)
        tokens_spot += max(0.0, expected_throughput(workers, n, terms.availability) * seconds - regenerated)
        preemptions += interval_preemptions
    hours = sum(interval.hours for interval in schedule)
    return ScheduleCost(hours, tokens_od, dollars_od, tokens_spot, dollars_spot, preemptions, tokens_od - tokens_spot)
