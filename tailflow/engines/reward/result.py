"""The record every reward function returns (its own module: the code reward's test runner imports no
math verifier)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardResult:
    """One response's score; every reward function returns it.

    `timeouts` counts executions that ran out of time (code rewards); `exec_s` is the longest single
    execution (code rewards: the adaptive timeout anchors on it when `correct`), None where nothing ran.
    """

    reward: float
    correct: bool
    formatted: bool
    timeouts: int = 0
    exec_s: float | None = None
