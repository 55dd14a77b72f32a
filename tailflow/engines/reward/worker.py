"""A reward worker: one reward function behind one method, for `ray.remote`.

Like the rollout worker, nothing here imports Ray, so tests can score in-process
with the same class. Each item is timed inside the worker with wall-clock
stamps, which is how the driver tells reward time hidden behind rollout from
reward time it waited for.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.result import RewardResult
from tailflow.engines.reward.spec import RewardSpec, build_reward


@dataclass(frozen=True)
class ScoreItem:
    request_id: str
    text: str
    """The decoded response."""
    problem: Problem
    timeout_s: float | None = None
    """Per-execution timeout for code rewards (the adaptive timeout); None for the others."""


@dataclass(frozen=True)
class ScoreOutcome:
    request_id: str
    result: RewardResult
    started_at: float
    """time.time() when the worker began this item."""
    finished_at: float

    @property
    def seconds(self) -> float:
        return self.finished_at - self.started_at


class RewardWorker:
    def __init__(self, spec: RewardSpec) -> None:
        if spec.type == "judge":  # only the judge computes with torch; importing it costs the others seconds
            import torch

            torch.set_num_threads(1)  # a judge model must not take every core from rollout
        self.reward = build_reward(spec)

    def score(self, items: Sequence[ScoreItem]) -> list[ScoreOutcome]:
        outcomes = []
        for item in items:
            started = time.time()
            result = self.reward.score_problem(item.text, item.problem, item.timeout_s)
            outcomes.append(ScoreOutcome(item.request_id, result, started, time.time()))
        return outcomes

    def ping(self) -> bool:
        return True

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        close = getattr(self.reward, "close", None)
        if close is not None:
            close()
