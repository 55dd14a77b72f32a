"""Adaptive execution timeout for code rewards (RollPacker's reward scheduler).

    T = min(max(T_min, lambda * T_anchor), T_max)

`T_anchor` is the slowest single execution of a *correct* response seen so far:
correct code has shown how long the task needs, and anything much slower is
almost surely looping. With one anchor per task every problem shares it; per
problem, a problem's own anchor (else the dataset's reference time for it,
else nothing) applies. Before any anchor exists the timeout is T_max, the
fixed timeout a non-adaptive run uses throughout.

Anchors are read from the last commit and updated from the iteration's
results in launch order, after scoring: every response of an iteration gets
the timeout the commit implies, whatever order the reward workers finish in,
and a resumed run continues with exactly the anchors it had.
"""
from __future__ import annotations

from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

from tailflow.engines.data.problem import Problem


class TimeoutAnchors(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_s: float | None = None
    """Slowest correct execution over all problems (`reward.timeout_anchor: task`)."""
    problem_s: dict[str, float] = Field(default_factory=dict)
    """Slowest correct execution per problem id (`reward.timeout_anchor: problem`)."""


class TimeoutPolicy:
    """The formula with its settings; `None` anchors mean a fixed `max_s`."""

    def __init__(self, adaptive: bool, scale: float, min_s: float, max_s: float, scope: str) -> None:
        if scope not in ("task", "problem"):
            raise ValueError(f"reward.timeout_anchor must be 'task' or 'problem', got {scope!r}")
        self.adaptive, self.scale, self.min_s, self.max_s, self.scope = adaptive, scale, min_s, max_s, scope

    @classmethod
    def from_config(cls, reward_config) -> "TimeoutPolicy":
        return cls(reward_config.adaptive_timeout, reward_config.timeout_scale, reward_config.timeout_min_s,
                   reward_config.timeout_max_s, reward_config.timeout_anchor)

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
        task_s, problem_s = anchors.task_s, dict(anchors.problem_s)
        for problem, correct, exec_s in observed:
            if not correct or exec_s is None:
                continue
            task_s = exec_s if task_s is None else max(task_s, exec_s)
            problem_s[problem.problem_id] = max(problem_s.get(problem.problem_id, exec_s), exec_s)
        if self.scope == "task":
            return TimeoutAnchors(task_s=task_s, problem_s={})
        return TimeoutAnchors(task_s=task_s, problem_s=problem_s)
