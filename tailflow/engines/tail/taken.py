"""What the rollout pipeline hands over: a round as the trainer takes it, and what the rollout did meanwhile.

One record for every mode: a synchronous round (alpha 0) is taken the moment
its rule is done, with nothing ahead of it and nothing stale; an asynchronous
one may have rounds running ahead and responses sampled by older weights.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence, TypeVar

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion, Request
from tailflow.engines.rollout.rollout_stats import RolloutStats
from tailflow.engines.tail.completion import RoundResult
from tailflow.engines.tail.observer import RoundObserver
from tailflow.engines.tail.round import PlannedRound

ObserverT = TypeVar("ObserverT", bound=RoundObserver)


@dataclass(frozen=True)
class TakenRound:
    """Round `iteration` once its completion rule is done: what it launched, what it kept, how stale it is."""

    planned: PlannedRound
    requests: list[Request]
    """Every request launched, in launch order (`launch.py`)."""
    result: RoundResult
    stats: RolloutStats
    """The engines' work from the last weight sync to the moment the round was taken."""
    problems: list[Problem]
    """The completed prompts, in launch order."""
    completions: list[Completion]
    """Their kept responses, prompt by prompt in launch order (what the trainer sees)."""
    finished: list[Completion]
    """Every finished response the rule saw, in the order it saw them (kept or not): the rollout trace's."""
    aborted: list[Completion]
    """Partials of the requests the rule aborted."""
    finish_steps: dict[str, tuple[int, int]]
    """Finished request id -> (worker, engine step of the round), where the rollout reports it (traces)."""
    observer: RoundObserver
    """The round's observer, built when it was launched: in a run a `RoundWork` (its scorer and, with the stream
    trainer, its step), in the simulator a `StreamedRound`: `observer_as` narrows to the one expected."""
    staleness: dict[int, int]
    """Versions between the trained weights and a response's oldest token -> number of responses."""
    mixed_version_responses: int
    """Kept responses whose tokens come from more than one weight version (continued across a sync)."""
    rounds_ahead: int
    """Rounds launched beyond this one when it was taken (0 when synchronous)."""
    prompts_in_flight: int
    continued: dict[str, int] = field(default_factory=dict)
    """Request id -> tokens it carried from the round that deferred its prompt (tail.continue_deferred); a
    request that started here is not in it."""

    @property
    def iteration(self) -> int:
        return self.planned.plan.iteration

    def observer_as(self, kind: type[ObserverT]) -> ObserverT:
        """The observer as whoever launched the round built it (a run's `RoundWork`, the simulator's
        `StreamedRound`), where the pipeline types it as any `RoundObserver`."""
        if not isinstance(self.observer, kind):
            raise TypeError(f"round {self.iteration}'s observer is a {type(self.observer).__name__}, not the "
                            f"{kind.__name__} expected")
        return self.observer


@dataclass(frozen=True)
class OverlapStats:
    """What the rollout did while the trainer ran a step (all zero when synchronous)."""

    seconds: float = 0.0
    """Wall time the driver spent driving the rollout while the train step ran."""
    engine_steps: int = 0
    """Engine steps asked for (per worker) meanwhile."""
    finished: int = 0
    """Responses finished meanwhile."""
    tokens: int = 0
    """Tokens generated meanwhile (not in the next round's `rollout/tokens`, which counts from the sync)."""


def staleness_of(completions: Sequence[Completion], version: int) -> dict[int, int]:
    """Versions between `version` (the weights that will train) and each response's oldest token -> count."""
    return dict(sorted(Counter(version - completion.oldest_weight_version for completion in completions).items()))
