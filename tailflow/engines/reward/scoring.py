"""Completions in, scored groups out: the record the trainer consumes.

A group is one prompt with the responses kept for it; GRPO normalises rewards
within a group, so grouping happens here, once, by problem id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion

if TYPE_CHECKING:
    from tailflow.engines.reward.streaming import ScoringStats


@dataclass(frozen=True)
class ScoredResponse:
    completion: Completion
    text: str
    reward: float
    correct: bool
    exec_s: float | None = None
    """Longest code execution of this response (code rewards), for the adaptive timeout."""


@dataclass(frozen=True)
class ScoredGroup:
    problem: Problem
    responses: tuple[ScoredResponse, ...]

    @property
    def rewards(self) -> list[float]:
        return [response.reward for response in self.responses]


@dataclass(frozen=True)
class ScoredRound:
    """A round's scored groups (launch order) and how its scoring went; `seconds` is the scoring phase's wall
    time after rollout (`time/step_reward`)."""

    groups: list[ScoredGroup]
    stats: "ScoringStats"
    seconds: float

    def observed_times(self) -> list[tuple[Problem, bool, float | None]]:
        """(problem, correct, slowest execution) of every response: what the adaptive timeout learns from."""
        return [(group.problem, response.correct, response.exec_s) for group in self.groups
                for response in group.responses]


def group_completions(problems: Sequence[Problem], completions: Sequence[Completion]) -> dict[str, list[Completion]]:
    """Completions by problem id, in the order of `problems`; each list in response-index order."""
    by_problem: dict[str, list[Completion]] = {problem.problem_id: [] for problem in problems}
    for completion in completions:
        problem_id = completion.problem_id
        if problem_id not in by_problem:
            raise KeyError(f"completion {completion.request_id} belongs to no problem of this round")
        by_problem[problem_id].append(completion)
    for group in by_problem.values():
        group.sort(key=lambda c: c.index)
    return by_problem


def groups_from_outcomes(problems: Sequence[Problem], completions: Sequence[Completion], outcomes: Mapping,
                         texts: Mapping[str, str]) -> list[ScoredGroup]:
    """Scored groups from reward-pool outcomes (`request_id -> ScoreOutcome`), in `problems` order; `texts` are
    the responses as the reward saw them (decoded once, by the scorer)."""
    by_problem = group_completions(problems, completions)
    groups = []
    for problem in problems:
        scored = []
        for completion in by_problem[problem.problem_id]:
            result = outcomes[completion.request_id].result
            scored.append(ScoredResponse(completion, texts[completion.request_id], result.reward, result.correct,
                                         result.exec_s))
        groups.append(ScoredGroup(problem, tuple(scored)))
    return groups
