"""Everything one run holds while it lives: config, data, store, settings read once, and the workers.

Built once by the parent flow and handed to every iteration; the Ray actors in
it stay alive (models loaded) for the whole run. It never changes: replacing
dead workers builds a new context (`replacing`), so nothing that holds the
old one sees half-swapped actors.

A plain class on purpose, not a dataclass: Prefect walks every dataclass,
list and dict in a task's arguments looking for upstream results, and
walking 20,000 problems on each of six task calls kept the driver at 100%
CPU between phases (+50% step time). Prefect treats a plain object as a leaf.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

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
    from tailflow.engines.round_work import RoundWorkFactory
    from tailflow.engines.store import ArtifactStore
    from tailflow.engines.tail.pipeline import RolloutPipeline
    from tailflow.engines.tail.state import TailSettings
    from tailflow.engines.track import MetricsLogger
    from tailflow.engines.track.live import RoundWatcher


class RunContext:
    run_id: str
    config: RunConfig
    store: ArtifactStore
    tokenizer: PreTrainedTokenizerBase
    train_problems: list[Problem]
    eval_problems: list[Problem]
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
    critic: TrainerGroup | None
    """train.advantage gae's value model (its own ranks); None: no critic."""
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
    watch: Callable[[Sequence[Problem]], RoundWatcher] | None
    """Live progress: a watcher for each round's finished responses (None: nobody watches)."""
    round_work: RoundWorkFactory | None
    """Builds each launched round's observer (scorer, stream trainer step) over these workers; each iteration
    hands the pipeline its hook for the last commit's timeout anchors (`launching_from`, tasks/rollout.py)."""
    pipeline: RolloutPipeline | None
    """The rounds on `rollout`, synchronous or running ahead of training (engines/tail/pipeline.py); None only
    while the context is being built. It is the one part of a run that lives across iterations outside the
    commits; each iteration restores it from the last commit unless it is already there."""

    __slots__ = tuple(__annotations__)  # the fields above, each once (annotations alone make no class attribute)

    def __init__(self, **fields) -> None:
        optional = {"watch", "round_work", "pipeline"}
        missing = set(self.__slots__) - set(fields) - optional
        if missing:
            raise TypeError(f"RunContext needs {', '.join(sorted(missing))}")
        for name in optional:
            fields.setdefault(name, None)
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"RunContext is immutable (tried to set {name}); build a new one with `replacing`")

    def replacing(self, **changes) -> RunContext:
        """The same run with some parts replaced: new worker groups after an actor died (`driver/context.py` then
        builds the round observers and the pipeline over them again)."""
        unknown = set(changes) - set(self.__slots__)
        if unknown:
            raise TypeError(f"RunContext has no {', '.join(sorted(unknown))}")
        return RunContext(**{**{name: getattr(self, name) for name in self.__slots__}, **changes})

    def fault_point(self, phase: str, iteration: int) -> None:
        """The crash point `phase` of engines/faults.py (a no-op unless TAILFLOW_FAULT is set)."""
        fault_point(phase, iteration, {"kill-rollout": lambda: self.rollout.worker_pid(0),
                                       "kill-trainer": lambda: self.trainer.worker_pid(0),
                                       "kill-reward": lambda: self.reward_pool.worker_pid(0)})
