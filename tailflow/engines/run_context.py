"""Everything one run holds while it lives: config, data, store, settings read once, and the workers.

Built once by the parent flow and handed to every iteration; the Ray actors in
it stay alive (models loaded) for the whole run. It never changes: replacing
dead workers builds a new context (`with_workers`), so nothing that holds the
old one sees half-swapped actors.

A plain class on purpose, not a dataclass: Prefect walks every dataclass,
list and dict in a task's arguments looking for upstream results, and
walking 20,000 problems on each of six task calls kept the driver at 100%
CPU between phases (+50% step time). Prefect treats a plain object as a leaf.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tailflow.engines.faults import fault_point

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from tailflow.config import RunConfig
    from tailflow.engines.cluster.reward_pool import RewardPool
    from tailflow.engines.cluster.rollout_group import RolloutGroup
    from tailflow.engines.cluster.trainer_group import TrainerGroup
    from tailflow.engines.data.problem import Problem
    from tailflow.engines.reward.spec import RewardSpec
    from tailflow.engines.reward.timeouts import TimeoutPolicy
    from tailflow.engines.rollout.protocol import SamplingParams
    from tailflow.engines.store import ArtifactStore
    from tailflow.engines.tail.pipeline import RolloutPipeline
    from tailflow.engines.tail.state import TailSettings
    from tailflow.engines.track import MetricsLogger


class RunContext:
    __slots__ = ("run_id", "config", "store", "tokenizer", "train_problems", "eval_problems", "problems_by_id",
                 "reward", "timeouts", "sampling", "tail", "rollout", "trainer", "reward_pool", "metrics",
                 "model_path", "model_config", "max_seq_len", "num_skipped_rows", "pipeline")

    run_id: str
    config: RunConfig
    store: ArtifactStore
    tokenizer: PreTrainedTokenizerBase
    train_problems: list[Problem]
    eval_problems: list[Problem]
    problems_by_id: dict[str, Problem]
    reward: RewardSpec
    """Which reward, and what it implies (`runs_code`)."""
    timeouts: TimeoutPolicy
    """The code reward's adaptive timeout (its anchors live in the run state)."""
    sampling: SamplingParams
    """Training rollouts' sampling, from `rollout.*`."""
    tail: TailSettings
    """Round shaping, from `data.*`, `rollout.n` and `tail.*`."""
    rollout: RolloutGroup
    trainer: TrainerGroup
    reward_pool: RewardPool
    """The reward workers (math, code or judge)."""
    metrics: MetricsLogger
    model_path: str
    """The initial policy (HF directory)."""
    model_config: PretrainedConfig
    """Its transformers config (checkpoints are written with it)."""
    max_seq_len: int
    """Longest prompt + rollout.max_new_tokens: the engines' sequence capacity."""
    num_skipped_rows: int
    """Dataset rows skipped as invalid (data.on_invalid: skip)."""
    pipeline: RolloutPipeline | None
    """Asynchronous runs: the rounds running ahead of training on `rollout` (None in synchronous runs). It is
    the one part of a run that lives across iterations outside the commits; each iteration restores it from
    the last commit unless it is already there."""

    def __init__(self, **fields) -> None:
        missing = set(self.__slots__) - set(fields) - {"problems_by_id", "pipeline"}
        if missing:
            raise TypeError(f"RunContext needs {', '.join(sorted(missing))}")
        fields.setdefault("problems_by_id", {problem.problem_id: problem for problem in fields["train_problems"]})
        fields.setdefault("pipeline", None)
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"RunContext is immutable (tried to set {name}); build a new one with `with_workers`")

    def with_workers(self, rollout: RolloutGroup, trainer: TrainerGroup, reward_pool: RewardPool) -> RunContext:
        """The same run with new worker groups (after an actor died)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        pipeline = self.pipeline.rebound(rollout) if self.pipeline is not None else None
        return RunContext(**{**fields, "rollout": rollout, "trainer": trainer, "reward_pool": reward_pool,
                             "pipeline": pipeline})

    def with_pipeline(self, pipeline: RolloutPipeline) -> RunContext:
        """The same run with an asynchronous rollout pipeline (built over this context's rollout workers)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        return RunContext(**{**fields, "pipeline": pipeline})

    def fault_point(self, phase: str, iteration: int) -> None:
        """The crash point `phase` of engines/faults.py (a no-op unless TAILFLOW_FAULT is set)."""
        fault_point(phase, iteration, {"kill-rollout": lambda: self.rollout.worker_pid(0),
                                       "kill-trainer": lambda: self.trainer.worker_pid(0),
                                       "kill-reward": lambda: self.reward_pool.worker_pid(0)})
