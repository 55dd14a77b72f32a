"""What one iteration did, phase by phase: the typed results its metrics row and next state are built from.

Each phase returns its own record with its own timing (`TakenRound.stats`,
`ScoredRound.seconds`, `TrainStepStats.seconds`, ...); `IterationOutcome`
gathers them so `RunState.advance` and `track.summary.metrics_row` read
named fields, never a dict another phase filled in.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.env.worker import EnvCounters
from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.reward.timeouts import TimeoutAnchors
from tailflow.engines.tail.state import TailState
from tailflow.engines.tail.taken import OverlapStats, TakenRound
from tailflow.engines.train.trainer import TrainStepStats


@dataclass(frozen=True)
class WeightSync:
    version: int
    """The weight version every rollout engine now holds."""
    seconds: float


@dataclass(frozen=True)
class Evaluation:
    accuracy: float
    """Greedy held-out accuracy of the weights at the end of the iteration."""
    seconds: float


@dataclass(frozen=True)
class IterationOutcome:
    iteration: int
    attempt: int
    """0, or how many earlier tries of this iteration lost an actor."""
    taken: TakenRound
    scored: ScoredRound
    trained: TrainStepStats
    overlap: OverlapStats
    """What the rollout did while the trainer trained (asynchronous runs)."""
    stopped_at_sync: int
    """Requests in flight stopped for the weight sync (asynchronous runs)."""
    synced: WeightSync
    evaluated: Evaluation | None
    """None when no evaluation was due."""
    tail: TailState
    """The tail state after this round settled (its unfinished prompts queued)."""
    anchors: TimeoutAnchors
    """The code reward's timeout anchors after this round's responses."""
    reports_anchor: bool
    """Whether the reward runs code (then the metrics row carries the task anchor)."""
    is_async: bool
    """rollout.async_ratio > 0 (then the metrics row carries staleness and overlap)."""
    env_counters: EnvCounters | None = None
    """An agentic run's (`env` set): what its environment workers counted over this iteration
    (`EnvGroup.counters_since_last_read`); then the metrics row carries `env/*`. None: a single-turn run."""

    @property
    def step_seconds(self) -> float:
        """`time/step_total`: rollout, reward, train and weight sync (evaluation and commit excluded)."""
        return self.taken.stats.seconds + self.scored.seconds + self.trained.seconds + self.synced.seconds
