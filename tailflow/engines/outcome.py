"""What one iteration did, phase by phase: the typed results its metrics row and next state are built from.

Each phase returns its own record with its own timing (`RoundRollout.stats`,
`ScoredRound.seconds`, `TrainStepStats.seconds`, ...); `IterationOutcome`
gathers them so `RunState.advance` and `track.summary.metrics_row` read
named fields, never a dict another phase filled in.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.reward.scoring import ScoredRound
from tailflow.engines.reward.timeouts import TimeoutAnchors
from tailflow.engines.tail.roll_out import RoundRollout
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailState
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
    planned: PlannedRound
    rollout: RoundRollout
    scored: ScoredRound
    trained: TrainStepStats
    synced: WeightSync
    evaluated: Evaluation | None
    """None when no evaluation was due."""
    tail: TailState
    """The tail state after this round settled (its unfinished prompts queued)."""
    anchors: TimeoutAnchors
    """The code reward's timeout anchors after this round's responses."""
    reports_anchor: bool
    """Whether the reward runs code (then the metrics row carries the task anchor)."""

    @property
    def step_seconds(self) -> float:
        """`time/step_total`: rollout, reward, train and weight sync (evaluation and commit excluded)."""
        return self.rollout.stats.seconds + self.scored.seconds + self.trained.seconds + self.synced.seconds
