"""Completions in, scored groups out: the record the trainer consumes.

A group is one prompt with the responses kept for it; GRPO normalises rewards
within a group, so grouping happens here, once, by problem id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion


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
class ScoringStats:
    busy_s: float
    """Scoring time summed over responses (worker wall clock)."""
    hidden_s: float
    """The part of busy_s that ran before rollout ended."""
    num_scored: int
    num_unused: int
    """Scored responses the round did not keep (their prompt was deferred, or they raced an abort)."""
    unused_reward_sum: float
    """Their rewards summed (`engines/track/tail_bias.py`: the unkept responses' mean reward)."""
    num_timeouts: int
    """Code executions that timed out, in kept responses."""
    workers: int
    """Most reward workers alive during the round."""

    @property
    def overlap_ratio(self) -> float:
        return self.hidden_s / self.busy_s if self.busy_s > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "time/reward_overlap_ratio": self.overlap_ratio,
            "reward/timeouts": self.num_timeouts,
            "time/reward_workers": self.workers,
            "time/reward_busy": self.busy_s,
            "reward/unused_scores": self.num_unused,
        }


@dataclass(frozen=True)
class ScoredRound:
    """A round's scored groups (launch order) and how its scoring went; `seconds` is the scoring phase's wall
    time after rollout (`time/step_reward`)."""

    groups: list[ScoredGroup]
    stats: ScoringStats
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
