"""The record every dataset yields: one verifiable problem."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt with its checkable answer.

    `problem_id` is stable across runs (the long-prompt queue and resume refer
    to problems by it); `solution` is a reference response, used only by the
    warm-start SFT and absent for most real datasets.
    """

    problem_id: str
    prompt: str
    answer: str
    solution: str | None = None
