"""The stream trainer (RollPacker, arXiv 2509.21009, sec. 5): train each group while the round's tail generates.

A GRPO group's advantages need only its own R0 rewards, so a group can be
trained as soon as its prompt completes (`tail/completion.py`) and its kept
responses are scored (streamed scoring, `reward/streaming.py`). The loss
divisors, though, are counts over the whole batch, unknown until the round
ends: how the ranks still take the non-streamed step's gradient is
`PolicyTrainer.accumulate` / `finish_step` (trainer.py's docstring).

`train.skip_zero_advantage` holds here too: samples with advantage 0 are
never sent (a group whose rewards are all equal sends nothing), and a round
with no signal at all trains its first sample, as the non-streamed step does.

An iteration tried again after an actor died runs on fresh trainer ranks
(`flows/training.py` replaces every actor), so the gradients of a half-streamed
step never reach the next try.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Protocol, Sequence

from tailflow.engines.reward.scoring import ScoredGroup, ScoredRound
from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.train.batch import TrainSample, count_response_tokens
from tailflow.engines.train.samples import samples_from_groups, samples_with_signal
from tailflow.engines.train.trainer import TrainStepStats


class StreamTrainer(Protocol):
    """The streamed half of `TrainerGroup` (non-blocking `accumulate`, then `finish_step`)."""

    def accumulate(self, samples: list[TrainSample]) -> None: ...
    def finish_step(self, num_tokens_total: int, num_sequences_total: int,
                    num_metric_tokens: int) -> TrainStepStats: ...


class GroupScores(Protocol):
    """The part of `StreamingScorer` the stream reads: a completed prompt's group once it is scored."""

    def scored_group(self, problem_id: str, kept: Sequence[Completion]) -> ScoredGroup | None: ...


class StreamedStep:
    """One iteration's optimizer step, fed group by group during rollout; build one per iteration."""

    def __init__(self, trainer: StreamTrainer, scores: GroupScores, estimator: str, *, weight_version: int,
                 skip_zero_advantage: bool, rollout_temperature: float | None = None,
                 max_staleness: int | None = 0) -> None:
        """`rollout_temperature`: the round's sampling temperature; `max_staleness`: how many versions older than
        `weight_version` a token may be (None: no bound, tail.continue_deferred) (both `samples_from_groups`)."""
        self.trainer, self.scores, self.estimator = trainer, scores, estimator
        self.weight_version, self.skip_zero_advantage = weight_version, skip_zero_advantage
        self.rollout_temperature = rollout_temperature
        self.max_staleness = max_staleness
        self._waiting: dict[str, tuple[Completion, ...]] = {}
        """Completed prompts whose responses are not all scored yet, in completion order."""
        self.sent: dict[str, ScoredGroup] = {}
        """Groups handled during rollout, by problem id (those with only zero advantages sent nothing)."""
        self.num_streamed_groups = 0
        """Groups whose samples went to the trainer during rollout."""
        self.num_trained_samples = 0
        self.num_trained_tokens = 0

    def on_completed(self, completed: Sequence[tuple[str, Sequence[Completion]]]) -> None:
        """After each batch of finished responses (`roll_out_round`): the prompts that completed in it, with their
        kept responses. Every group now scored, these and earlier ones, goes to the trainer."""
        self._waiting.update((problem_id, tuple(kept)) for problem_id, kept in completed)
        ready = []
        for problem_id, kept in list(self._waiting.items()):
            group = self.scores.scored_group(problem_id, kept)
            if group is not None:
                ready.append(group)
                del self._waiting[problem_id]
        trained = [samples_with_signal(self._samples([group]), self.skip_zero_advantage) for group in ready]
        self._send([sample for part in trained for sample in part])
        self.sent.update((group.problem.problem_id, group) for group in ready)
        self.num_streamed_groups += sum(1 for part in trained if part)

    def finish(self, scored: ScoredRound) -> TrainStepStats:
        """After scoring: send the groups not sent yet, then the one optimizer step over the whole batch's counts.
        `seconds` is this call's wall time: the train time rollout did not hide."""
        started = time.perf_counter()
        missing = set(self.sent) - {group.problem.problem_id for group in scored.groups}
        if missing:
            raise ValueError(f"groups {sorted(missing)} were trained during rollout but are not in the round's batch")
        samples = self._samples(scored.groups)
        unsent = [group for group in scored.groups if group.problem.problem_id not in self.sent]
        rest = samples_with_signal(self._samples(unsent), self.skip_zero_advantage)
        if not rest and self.num_trained_samples == 0:
            rest = samples[:1]  # no signal anywhere: a real zero-gradient step, as train_step takes
        self._send(rest)
        stats = self.trainer.finish_step(count_response_tokens(samples), len(samples), self.num_trained_tokens)
        return replace(stats, num_samples=len(samples), skipped_samples=len(samples) - self.num_trained_samples,
                       seconds=time.perf_counter() - started, streamed_groups=self.num_streamed_groups)

    def _samples(self, groups: Sequence[ScoredGroup]) -> list[TrainSample]:
        return samples_from_groups(groups, self.estimator, weight_version=self.weight_version,
                                   max_staleness=self.max_staleness, rollout_temperature=self.rollout_temperature)

    def _send(self, samples: list[TrainSample]) -> None:
        if samples:
            self.trainer.accumulate(samples)
            self.num_trained_samples += len(samples)
            self.num_trained_tokens += count_response_tokens(samples)
