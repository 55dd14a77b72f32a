"""A round's progress from its finished responses: what the live line (driver/live_progress.py) shows.

The streamed scorer (engines/reward/streaming.py) sees every response the moment its engine finishes it and
hands it to the watcher it was built with; the watcher counts here. No Prefect or terminal code lives here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from tailflow.engines.rollout.protocol import Completion

RoundWatcher = Callable[[Sequence[Completion]], None]


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
            self.finished[completion.problem_id] = self.finished.get(completion.problem_id, 0) + 1
            self.num_tokens += len(completion.token_ids)

    @property
    def prompts_done(self) -> int:
        done = sum(1 for count in self.finished.values() if count >= self.responses_needed)
        return min(done, self.prompts_needed)

    @property
    def in_flight(self) -> int:
        """Requests launched and not finished yet (aborts happen only as the round ends)."""
        return self.num_prompts * self.responses_per_prompt - sum(self.finished.values())
