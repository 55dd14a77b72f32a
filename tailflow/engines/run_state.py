"""The run's durable state: what a resumed run needs to continue exactly.

Committed with every iteration as `<run_id>/state.json`. RNG states and
reward-timeout anchors join it as those parts land.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CursorState(BaseModel):
    epoch: int = 0
    position: int = 0
    num_drawn: int = 0


class RunState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    iteration: int = 0
    """Next iteration to run (= iterations completed)."""
    weight_version: int = 0
    """Version of the policy weights; +1 per optimizer step."""
    cursor: CursorState = Field(default_factory=CursorState)
    long_queue: list[dict] = Field(default_factory=list)
    """Tail batching's long-prompt queue (`LongPromptQueue.to_state()`), oldest first."""
    latest_checkpoint: str | None = None
    """Store key of the newest committed checkpoint directory."""
    initial_eval_accuracy: float | None = None
    last_eval_accuracy: float | None = None
