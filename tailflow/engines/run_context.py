"""Everything one run holds while it lives: config, data, store and workers.

Built once by the parent flow and handed to every iteration; the Ray actors in
it stay alive (models loaded) for the whole run.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailflow.config import RunConfig
from tailflow.engines.data.problem import Problem
from tailflow.engines.store import LocalStore
from tailflow.engines.track import MetricsLogger


@dataclass
class RunContext:
    run_id: str
    config: RunConfig
    store: LocalStore
    tokenizer: Any
    train_problems: list[Problem]
    eval_problems: list[Problem]
    reward: Any
    rollout: Any
    """RolloutGroup"""
    trainer: Any
    """TrainerGroup"""
    metrics: MetricsLogger
    model_path: str
    """The initial policy (HF directory)."""
    data_notes: dict[str, Any] = field(default_factory=dict)
    problems_by_id: dict[str, Problem] = field(init=False)

    def __post_init__(self) -> None:
        self.problems_by_id = {problem.problem_id: problem for problem in self.train_problems}

    def run_key(self, *parts: str) -> str:
        return "/".join([self.run_id, *parts])
