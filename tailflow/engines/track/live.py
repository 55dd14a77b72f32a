"""Watching a round while it runs: the one seam from inside the rollout to whoever shows progress.

The streamed scorer (engines/reward/streaming.py) already sees every response
the moment its engine finishes it. When a run shows live progress, its flow
registers a factory here (`watch_rounds`); each streamed scorer asks it for a
watcher for its round (`round_watcher`) and hands it the finished responses.
A process-wide registry because the scorer is built inside a Prefect task
that receives only the run context; no Prefect or terminal code lives here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.scoring import problem_id_of
from tailflow.engines.rollout.protocol import Completion

RoundWatcher = Callable[[Sequence[Completion]], None]
_factory: Callable[[Sequence[Problem]], RoundWatcher | None] | None = None


def watch_rounds(factory: Callable[[Sequence[Problem]], RoundWatcher | None] | None) -> None:
    """Register (or, with None, remove) the factory of round watchers for this process."""
    global _factory
    _factory = factory


def round_watcher(problems: Sequence[Problem]) -> RoundWatcher | None:
    """A watcher for a round launching `problems`, or None when nobody watches."""
    return _factory(problems) if _factory is not None else None


@dataclass
class RoundCount:
    """A round's progress from its finished responses: what the live line shows."""
    num_prompts: int
    """Prompts launched."""
    responses_per_prompt: int
    prompts_needed: int
    """P0: prompts a round trains on."""
    responses_needed: int
    """R0: finished responses that complete a prompt."""
    finished: dict[str, int] = field(default_factory=dict)
    num_tokens: int = 0

    def add(self, completions: Sequence[Completion]) -> None:
        for completion in completions:
            problem_id = problem_id_of(completion.request_id)
            self.finished[problem_id] = self.finished.get(problem_id, 0) + 1
            self.num_tokens += len(completion.token_ids)

    @property
    def prompts_done(self) -> int:
        done = sum(1 for count in self.finished.values() if count >= self.responses_needed)
        return min(done, self.prompts_needed)

    @property
    def in_flight(self) -> int:
        """Requests launched and not finished yet (aborts happen only as the round ends)."""
        return self.num_prompts * self.responses_per_prompt - sum(self.finished.values())
