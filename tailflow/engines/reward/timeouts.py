"""Adaptive execution timeout for code rewards (RollPacker's reward scheduler), with a robust anchor.

    T = min(max(T_min, lambda * T_anchor), T_max)

`T_anchor` is a high quantile of the slowest execution of each of the last
correct responses, not the paper's maximum, which a correct program sleeping
just under T can ratchet up to T_max. The whole rule (scopes, fallbacks,
anchors in the committed state, older states): docs/rewards.md, "Adaptive
timeout (code)".
"""
from __future__ import annotations

import math
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailflow.engines.data.problem import Problem

STORED_DIGITS = 4
"""Execution times are kept to 0.1 ms: the windows are part of every committed state."""


class TimeoutAnchors(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_s: float | None = None
    """The task's anchor: the quantile of `task_recent` (`reward.timeout_anchor: task`)."""
    problem_s: dict[str, float] = Field(default_factory=dict)
    """Each problem's anchor: the quantile of its window (`reward.timeout_anchor: problem`)."""
    task_recent: list[float] = Field(default_factory=list)
    """The slowest execution of each of the last correct responses over all problems, oldest first."""
    problem_recent: dict[str, list[float]] = Field(default_factory=dict)
    """The same, per problem id."""

    @model_validator(mode="before")
    @classmethod
    def _read_older_states(cls, data):
        """Commits from before the windows: each anchor becomes a window of one, so the next update has it."""
        if isinstance(data, dict) and "task_recent" not in data and "problem_recent" not in data:
            data = dict(data)
            if data.get("task_s") is not None:
                data["task_recent"] = [data["task_s"]]
            data["problem_recent"] = {pid: [seconds] for pid, seconds in (data.get("problem_s") or {}).items()}
        return data


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class TimeoutPolicy:
    """The formula with its settings; `None` anchors mean a fixed `max_s`."""

    def __init__(self, adaptive: bool, scale: float, min_s: float, max_s: float, scope: str,
                 quantile: float = 0.9, window: int = 100) -> None:
        if scope not in ("task", "problem"):
            raise ValueError(f"reward.timeout_anchor must be 'task' or 'problem', got {scope!r}")
        if not 0 < quantile <= 1:
            raise ValueError(f"reward.timeout_anchor_quantile must be in (0, 1], got {quantile}")
        if window < 1:
            raise ValueError(f"reward.timeout_anchor_window must be >= 1, got {window}")
        self.adaptive, self.scale, self.min_s, self.max_s, self.scope = adaptive, scale, min_s, max_s, scope
        self.quantile, self.window = quantile, window

    @classmethod
    def from_config(cls, reward_config) -> "TimeoutPolicy":
        return cls(reward_config.adaptive_timeout, reward_config.timeout_scale, reward_config.timeout_min_s,
                   reward_config.timeout_max_s, reward_config.timeout_anchor,
                   reward_config.timeout_anchor_quantile, reward_config.timeout_anchor_window)

    def anchor_of(self, problem: Problem, anchors: TimeoutAnchors) -> float | None:
        if self.scope == "task":
            return anchors.task_s
        if problem.problem_id in anchors.problem_s:
            return anchors.problem_s[problem.problem_id]
        return problem.tests.reference_time_s if problem.tests is not None else None

    def timeout_s(self, problem: Problem, anchors: TimeoutAnchors) -> float:
        anchor = self.anchor_of(problem, anchors) if self.adaptive else None
        if anchor is None:
            return self.max_s
        return min(max(self.min_s, self.scale * anchor), self.max_s)

    def updated(self, anchors: TimeoutAnchors, observed: Iterable[tuple[Problem, bool, float | None]]
                ) -> TimeoutAnchors:
        """New anchors after (problem, correct, longest execution) results, taken in the given order."""
        task_recent = list(anchors.task_recent)
        problem_recent = {pid: list(times) for pid, times in anchors.problem_recent.items()}
        for problem, correct, exec_s in observed:
            if not correct or exec_s is None:
                continue
            seconds = round(exec_s, STORED_DIGITS)
            task_recent = [*task_recent, seconds][-self.window:]
            if self.scope == "problem":
                recent = problem_recent.get(problem.problem_id, [])
                problem_recent[problem.problem_id] = [*recent, seconds][-self.window:]
        task_s = quantile(task_recent, self.quantile) if task_recent else None
        if self.scope == "task":
            return TimeoutAnchors(task_s=task_s, task_recent=task_recent)
        problem_s = {pid: quantile(times, self.quantile) for pid, times in problem_recent.items()}
        return TimeoutAnchors(task_s=task_s, problem_s=problem_s, task_recent=task_recent,
                              problem_recent=problem_recent)
