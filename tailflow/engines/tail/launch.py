"""The order a round's requests are launched in: response k of every prompt in turn.

A short round launches more requests than the engines have slots (e.g. 40
prompts x 10 responses into 128 slots), first come first served. Launched
prompt by prompt, the last prompts would wait for slots while the first ones
ran all their responses, so they would be deferred more often whatever their
length, and the long-prompt queue would partly hold late-launched prompts
rather than long ones. Interleaved, every prompt has its first responses
running from the first step, and what defers a prompt is its lengths.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def launch_order(prompts: Sequence[T], responses_per_prompt: int) -> list[tuple[T, int]]:
    """(prompt, response index) pairs: index 0 of every prompt, then index 1 of every prompt, ..."""
    return [(prompt, k) for k in range(responses_per_prompt) for prompt in prompts]
