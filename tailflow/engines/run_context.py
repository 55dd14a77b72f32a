"""Everything one run holds while it lives: config, data, store and workers.

Built once by the parent flow and handed to every iteration; the Ray actors in
it stay alive (models loaded) for the whole run.

A plain class on purpose, not a dataclass: Prefect walks every dataclass,
list and dict in a task's arguments looking for upstream results, and
walking 20,000 problems on each of six task calls kept the driver at 100%
CPU between phases (+50% step time). Prefect treats a plain object as a leaf.
"""
from __future__ import annotations

from typing import Any

from tailflow.config import RunConfig
from tailflow.engines.data.problem import Problem
from tailflow.engines.store import ArtifactStore
from tailflow.engines.track import MetricsLogger


class RunContext:
    def __init__(
        self,
        run_id: str,
        config: RunConfig,
        store: ArtifactStore,
        tokenizer: Any,
        train_problems: list[Problem],
        eval_problems: list[Problem],
        reward_pool: Any,
        timeouts: Any,
        rollout: Any,
        trainer: Any,
        metrics: MetricsLogger,
        model_path: str,
        model_config: Any = None,
        max_seq_len: int = 0,
        num_skipped_rows: int = 0,
    ):
        self.run_id = run_id
        self.config = config
        self.store = store
        self.tokenizer = tokenizer
        self.train_problems = train_problems
        self.eval_problems = eval_problems
        self.problems_by_id = {problem.problem_id: problem for problem in train_problems}
        self.reward_pool = reward_pool
        """RewardPool: the reward workers (math, code or judge)."""
        self.timeouts = timeouts
        """TimeoutPolicy: the code reward's adaptive timeout (anchors live in the run state)."""
        self.rollout = rollout
        """RolloutGroup"""
        self.trainer = trainer
        """TrainerGroup"""
        self.metrics = metrics
        self.model_path = model_path
        """The initial policy (HF directory)."""
        self.model_config = model_config
        """Its transformers config (checkpoints are written with it)."""
        self.max_seq_len = max_seq_len
        """Longest prompt + rollout.max_new_tokens: the engines' sequence capacity."""
        self.num_skipped_rows = num_skipped_rows
        """Dataset rows skipped as invalid (data.on_invalid: skip)."""

    def run_key(self, *parts: str) -> str:
        return "/".join([self.run_id, *parts])
