"""What a simulated run did, iteration by iteration, on the virtual clock: the records `simulate.py` keeps."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SimStep:
    """One iteration's timeline (virtual seconds from the run's start) and what the pipeline reported."""

    iteration: int
    start_s: float
    """The driver asked for the round (the previous iteration's weights were loaded)."""
    taken_s: float
    """The round's completion rule was done."""
    trained_s: float
    """Scoring and the train step were done."""
    end_s: float
    """The new weights were loaded on every replica and the paused requests resubmitted."""
    reward_s: float
    train_s: float
    sync_s: float
    overlap_tokens: int
    """Tokens generated while the round was scored and trained (0 when synchronous)."""
    staleness: dict[int, int]
    """Versions between the trained weights and a kept response's oldest token -> number of responses."""
    prompts_in_flight: int
    rounds_ahead: int
    tokens_restarted: int
    """Tokens of paused requests thrown away at the sync (restart mode: `partial` off)."""
    launched_problem_ids: tuple[str, ...]
    trained_problem_ids: tuple[str, ...]


@dataclass(frozen=True)
class SimRun:
    steps: tuple[SimStep, ...]
    rounds: tuple[Any, ...]
    """The `SimRound` of each iteration."""
    num_rollout_replicas: int
    rollout_busy_s: float
    """Replica-seconds the rollout engines spent prefilling and decoding."""
    queued_problem_ids: tuple[str, ...]
    """The long-prompt queue at the end: prompts launched but not (yet) trained."""

    @property
    def makespan_s(self) -> float:
        """From the first round's launch to the last iteration's weights loaded."""
        return self.steps[-1].end_s - self.steps[0].start_s

    @property
    def step_s(self) -> float:
        """Mean time per training step, pipeline fill included."""
        return self.makespan_s / len(self.steps)

    @property
    def rollout_utilisation(self) -> float:
        """Busy replica-seconds of the rollout pool / (replicas x makespan)."""
        return self.rollout_busy_s / (self.num_rollout_replicas * self.makespan_s)

    @property
    def trainer_utilisation(self) -> float:
        """Share of the makespan the trainer pool trains or sends weights."""
        return sum(s.train_s + s.sync_s for s in self.steps) / self.makespan_s

    @property
    def staleness_histogram(self) -> dict[int, int]:
        counts: Counter[int] = Counter()
        for step in self.steps:
            counts.update(step.staleness)
        return dict(sorted(counts.items()))

    @property
    def tokens_restarted(self) -> int:
        return sum(s.tokens_restarted for s in self.steps)
