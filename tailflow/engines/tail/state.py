"""Tail batching's durable state and its settings: the one record the policy reads and writes.

`TailState` is what the policy owns between iterations: the long-prompt queue
(problem ids with their deferral counts, oldest first) and the data cursor.
It lives in `RunState.tail` and is committed with every checkpoint, so a
resumed run plans its next round from exactly the queue and data position
it had. It is immutable: `begin_round` and `settle_round` (round.py) return
new states, so a step that crashes after planning leaves the committed one
untouched.
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from tailflow.config import default_responses_launched
from tailflow.engines.data.cursor import DataCursor
from tailflow.engines.tail.planner import ceil_product
from tailflow.engines.tail.queue import LongPromptQueue, QueuedPrompt


class TailState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: tuple[QueuedPrompt, ...] = ()
    """The long-prompt queue, oldest first (each problem id at most once)."""
    cursor: DataCursor = Field(default_factory=DataCursor)
    """Where fresh prompts are drawn from next: epoch and position in the seeded order."""

    def long_queue(self) -> LongPromptQueue:
        """A working copy of the queue (the policy's mutable view; this state is unchanged)."""
        return LongPromptQueue(self.queue)


@dataclass(frozen=True)
class TailSettings:
    """The round-shaping settings of a run (the config's data/rollout/tail fields, read once at setup) or of a
    simulated one: the one record of them the policy, the pipeline and the simulator read. Each field means what
    its key says in the configuration reference (docs/configuration.md): `data.prompts_per_step` (P0),
    `rollout.n` (R0, here `responses_kept`), `data.seed` (here `data_seed`), the rest `tail.*` of the same name."""

    prompts_per_step: int
    responses_kept: int
    prompt_ratio: float = 1.25
    responses_launched: int | None = None
    """None: filled in at construction with the config's default, R0 + ceil(R0 / 4)."""
    enabled: bool = True
    data_seed: int = 0
    steps_per_poll: int = 2
    """The round driver's granularity."""
    continue_deferred: bool = False
    """Implemented in carry.py."""
    defer: bool = True
    """False: a short round's unfinished prompts are dropped, not queued (`round.settle_round`)."""

    def __post_init__(self) -> None:
        if self.responses_launched is None:
            object.__setattr__(self, "responses_launched", default_responses_launched(self.responses_kept))

    @classmethod
    def from_config(cls, config) -> "TailSettings":
        return cls(prompts_per_step=config.data.prompts_per_step, responses_kept=config.rollout.n,
                   prompt_ratio=config.tail.prompt_ratio, responses_launched=config.responses_launched,
                   enabled=config.tail.enabled, data_seed=config.data.seed, steps_per_poll=config.tail.steps_per_poll,
                   continue_deferred=config.tail.continue_deferred, defer=config.tail.defer)


def in_flight_cap(alpha: float, prompts_per_step: int) -> int:
    """ceil(alpha * P0) + P0: the most prompts launched and not completed while rounds run ahead of training
    (ROLL-Flash's bound on what an asynchronous rollout may have outstanding)."""
    return ceil_product(alpha, prompts_per_step) + prompts_per_step
