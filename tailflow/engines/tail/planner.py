"""Round planning: which prompts the next step runs, and how many responses each.

RollPacker (arXiv 2509.21009) splits steps into two kinds. A *short round*
speculates: it launches more prompts (ceil(prompt_ratio * P0)) and more
responses per prompt than it keeps, so the step ends as soon as P0 prompts have
R0 finished responses; the stragglers go to the long-prompt queue. Once that
queue holds a full batch, a *long round* runs P0 of them with exactly R0
responses each and waits for all: the long tail is paid for rarely, in bulk.
With tail batching off, every step is the synchronous baseline (SYNC).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from tailflow.engines.tail.queue import LongPromptQueue, QueuedPrompt


class RoundKind(str, Enum):
    SHORT = "short"   # fresh prompts, over-provisioned, stragglers aborted and queued
    LONG = "long"     # queued prompts, exactly R0 responses each, wait for all
    SYNC = "sync"     # tail batching off: P0 fresh prompts x R0, wait for all


@dataclass(frozen=True)
class RoundPlan:
    kind: RoundKind
    iteration: int
    fresh_prompts: int
    """Prompts to draw from the data cursor (0 in a long round)."""
    queued: tuple[QueuedPrompt, ...]
    """Prompts taken from the long-prompt queue, oldest first (long rounds only)."""
    responses_per_prompt: int
    """Requests launched per prompt: responses_launched in a short round, else R0."""
    responses_kept: int
    """R0: finished responses kept (and trained on) per completed prompt."""
    prompts_to_complete: int
    """P0: the round ends when this many prompts have R0 finished responses."""

    @property
    def num_prompts(self) -> int:
        return self.fresh_prompts + len(self.queued)

    @property
    def round_metric(self) -> int:
        """`tail/round`: 1 for a long round, 0 otherwise (ROLL / RollPacker plots)."""
        return int(self.kind is RoundKind.LONG)


def ceil_product(ratio: float, count: int) -> int:
    """ceil(ratio * count), robust to float error (1.1 * 10 is 11.000000000000002): every ratio of a count
    (launched prompts, responses, prompts in flight) is rounded up with this one function."""
    return math.ceil(round(ratio * count, 9))


def launched_prompts(prompts_per_step: int, prompt_ratio: float) -> int:
    """ceil(prompt_ratio * P0): the prompts a short round launches."""
    return ceil_product(prompt_ratio, prompts_per_step)


def make_round_plan(
    queue: LongPromptQueue,
    iteration: int,
    prompts_per_step: int,
    responses_kept: int,
    prompt_ratio: float,
    responses_launched: int,
    enabled: bool,
) -> RoundPlan:
    """Plan step `iteration`; a long round *takes* its prompts out of `queue`.

    The queue is only changed in memory: the durable queue is the one committed
    in `RunState` with the last checkpoint, so a step that crashes after
    planning is re-planned from that state and no prompt is lost.
    """
    if prompts_per_step < 1:
        raise ValueError(f"prompts_per_step (P0) must be >= 1, got {prompts_per_step}")
    if responses_kept < 1:
        raise ValueError(f"responses_kept (R0) must be >= 1, got {responses_kept}")
    if not prompt_ratio >= 1:
        raise ValueError(f"prompt_ratio must be >= 1 (short rounds launch at least P0 prompts), got {prompt_ratio}")
    if responses_launched < responses_kept:
        raise ValueError(
            f"responses_launched ({responses_launched}) must be >= responses_kept ({responses_kept}): "
            "a prompt could never finish R0 responses"
        )
    kind, fresh, queued, per_prompt = RoundKind.SHORT, 0, (), responses_launched
    if not enabled:
        kind, fresh, per_prompt = RoundKind.SYNC, prompts_per_step, responses_kept
    elif len(queue) >= prompts_per_step:
        kind, queued, per_prompt = RoundKind.LONG, tuple(queue.take_oldest(prompts_per_step)), responses_kept
    else:
        fresh = launched_prompts(prompts_per_step, prompt_ratio)
    return RoundPlan(kind, iteration, fresh, queued, per_prompt, responses_kept, prompts_per_step)
