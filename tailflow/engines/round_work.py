"""A run's round observer: its scorer, and with the stream trainer its optimizer step, built when it is launched.

The rollout pipeline asks `RoundWorkFactory` for one per round when it launches it and shows it every response
as it finishes, in every mode: docs/architecture.md, "The one rollout driver".

A round's code tests get the timeout the anchors of the last commit before
its launch imply: the iteration that takes rounds from that commit gives the
pipeline the hook `launching_from(anchors)` (tasks/rollout.py), so every
response of a synchronous round, whatever order the reward workers finish in,
gets the same timeout. (A resumed asynchronous run scores the finished
responses of rounds launched ahead again with the anchors it resumed from, one
commit newer: for code rewards whose runs come near the timeout, that can
score differently from the uninterrupted run.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from tailflow.engines.data.problem import Problem
from tailflow.engines.reward.streaming import StreamingScorer, trajectory_reward_of
from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.track.live import RoundWatcher
from tailflow.engines.train.stream import StreamedStep

if TYPE_CHECKING:
    from tailflow.config import RunConfig
    from tailflow.engines.cluster.reward_pool import RewardPool
    from tailflow.engines.cluster.trainer_group import TrainerGroup


@dataclass
class RoundWork:
    """A run's `RoundObserver` (engines/tail/observer.py): what the pipeline shows a round's responses to, and
    what the tasks then collect the scores from (tasks/score.py) and finish the step of (tasks/train.py)."""

    scorer: StreamingScorer
    stream: StreamedStep | None = None
    """The round's optimizer step fed during rollout (train.stream); None: trained after scoring."""

    @property
    def watches_each_response(self) -> bool:
        return self.scorer.streaming

    def on_finished(self, completions: Sequence[Completion]) -> None:
        self.scorer.on_finished(completions)

    def on_completed(self, completed: Sequence[tuple[str, tuple[Completion, ...]]]) -> None:
        if self.stream is not None:
            self.stream.on_completed(completed)


class RoundWorkFactory:
    """Builds each launched round's `RoundWork` from the run's reward pool, trainer and settings; holds nothing
    that changes during the run (the anchors a round is scored with come with each call)."""

    def __init__(self, config: RunConfig, pool: RewardPool, trainer: TrainerGroup, tokenizer,
                 timeouts: TimeoutPolicy | None,
                 watch: Callable[[Sequence[Problem]], RoundWatcher] | None = None) -> None:
        """`timeouts`: the code reward's adaptive timeout (the context's `timeouts`; None: the reward runs no
        code); `watch` (live progress) gives a watcher for a round launching these problems."""
        self.config, self.pool, self.trainer, self.tokenizer = config, pool, trainer, tokenizer
        self.timeouts = timeouts
        self.watch = watch

    def launching_from(self, anchors: TimeoutAnchors) -> Callable[[PlannedRound, int], RoundWork]:
        """The pipeline's `observe` hook for the rounds launched (or replayed) after the commit that holds
        `anchors`, the code reward's timeout anchors (`RunState.reward_anchors`)."""
        return lambda planned, launched_version: self.build(planned, launched_version, anchors)

    def build(self, planned: PlannedRound, launched_version: int, anchors: TimeoutAnchors) -> RoundWork:
        """Round `planned`'s observer, launched under weights `launched_version`, its code tests timed out by
        `anchors`."""
        timeouts = self.timeouts
        timeout_of = (lambda problem: timeouts.timeout_s(problem, anchors)) if timeouts else (lambda problem: None)
        watcher = self.watch(planned.problems) if self.watch is not None else None
        scorer = StreamingScorer(self.pool, self.tokenizer, planned.problems, timeout_of,
                                 self.config.reward.streaming, watcher, trajectory_reward_of(self.config))
        train = self.config.train
        stream = StreamedStep(self.trainer, scorer, train.advantage, weight_version=launched_version,
                              skip_zero_advantage=train.skips_zero_advantage,
                              rollout_temperature=self.config.rollout.temperature,
                              max_staleness=self.config.tail.trained_token_age_bound(0)) if train.stream else None
        return RoundWork(scorer, stream)
