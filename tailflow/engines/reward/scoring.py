"""Completions in, scored groups out: the record the trainer consumes.

A group is one prompt with the responses kept for it; GRPO normalises rewards
within a group, so grouping happens here, once, by problem id.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Completion


class RewardFunction(Protocol):
    def score(self, response_text: str, gold_answer: str): ...


@dataclass(frozen=True)
class ScoredResponse:
    completion: Completion
    text: str
    reward: float
    correct: bool


@dataclass(frozen=True)
class ScoredGroup:
    problem: Problem
    responses: tuple[ScoredResponse, ...]

    @property
    def rewards(self) -> list[float]:
        return [response.reward for response in self.responses]


def problem_id_of(request_id: str) -> str:
    """Request ids are `<problem_id>#<k>`; the problem id is everything before the last '#'."""
    return request_id.rpartition("#")[0]


def group_completions(problems: Sequence[Problem], completions: Sequence[Completion]) -> dict[str, list[Completion]]:
    """Completions by problem id, in the order of `problems`; each list in response-index order."""
    by_problem: dict[str, list[Completion]] = {problem.problem_id: [] for problem in problems}
    for completion in completions:
        problem_id = problem_id_of(completion.request_id)
        if problem_id not in by_problem:
            raise KeyError(f"completion {completion.request_id} belongs to no problem of this round")
        by_problem[problem_id].append(completion)
    for group in by_problem.values():
        group.sort(key=lambda c: int(c.request_id.rpartition("#")[2]))
    return by_problem


def score_groups(
    problems: Sequence[Problem], completions: Sequence[Completion], reward: RewardFunction, tokenizer
) -> list[ScoredGroup]:
    by_problem = group_completions(problems, completions)
    groups = []
    for problem in problems:
        scored = []
        for completion in by_problem[problem.problem_id]:
            text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            result = reward.score(text, problem.answer)
            scored.append(ScoredResponse(completion, text, result.reward, result.correct))
        groups.append(ScoredGroup(problem, tuple(scored)))
    return groups
