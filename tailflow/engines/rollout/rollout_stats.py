"""What one rollout phase did, measured from the engines' counters."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tailflow.engines.rollout.protocol import Completion, EngineStats, FinishReason


@dataclass(frozen=True)
class RolloutStats:
    seconds: float
    tokens_generated: int
    bubble_ratio: float
    """1 - busy slot-steps / available slot-steps, over the engines' decode steps of this phase."""
    num_truncated: int
    max_engine_steps: int = 0
    """Decode steps of the engine that ran most (the simulator's round length in steps)."""

    def metrics(self) -> dict[str, float]:
        return {
            "time/step_generate": self.seconds,
            "rollout/tokens": self.tokens_generated,
            "rollout/bubble_ratio": self.bubble_ratio,
            "rollout/truncated": self.num_truncated,
        }


def summarize_rollout(
    completions: Sequence[Completion], before: Sequence[EngineStats], after: Sequence[EngineStats], seconds: float
) -> RolloutStats:
    busy = sum(a.busy_slot_steps - b.busy_slot_steps for a, b in zip(after, before))
    available = sum((a.steps - b.steps) * a.num_slots for a, b in zip(after, before))
    tokens = sum(a.tokens_generated - b.tokens_generated for a, b in zip(after, before))
    return RolloutStats(
        seconds=seconds,
        tokens_generated=tokens,
        bubble_ratio=1.0 - busy / available if available else 0.0,
        num_truncated=sum(1 for c in completions if c.finish_reason == FinishReason.LENGTH),
        max_engine_steps=max((a.steps - b.steps for a, b in zip(after, before)), default=0),
    )
