"""Asynchronous training on disaggregated pools: round i+1's rollout runs while round i trains.

The rounds are the policy's own (`PolicySimulation`: plan, run under the
completion rule, settle, with or without tail batching) on replicas of the
rollout pool. This module decides only *when* each round starts and when the
trainer pool trains it:

The rollout group keeps its own clock (only rollout advances it), so with
nothing landing mid-round its rounds are those of the synchronous simulator
bit for bit; the pipeline's clock is the group's plus the time it has waited.

* launch rule: round j starts when the rollout pool is free (rounds run one
  after another on it), the trainer has published version >= j - alpha, and
  the prompts in flight (P0 of every launched, not yet trained round, this
  one included) stay within ceil(alpha x P0) + P0;
* trainer: round k is scored (reward runs on CPUs, beside anything) after
  its rollout, trained once the trainer has trained and synced round k-1,
  and version k+1 reaches the rollout pool after train + weight sync. A
  version landing mid-round pauses the replicas that hold requests and, in
  restart mode, restarts their requests (`async_engine.py`);
* staleness bound: a group trained at step k whose oldest token came from
  version v has staleness k - v; a group over alpha is left out of the
  batch and its prompt joins the long-prompt queue (never dropped). The
  launch rule keeps this from happening; it is checked, not assumed.

With alpha = 0 round j waits for version j, so each step is rollout + reward
+ train + sync, the synchronous step of `step_time.py`.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from tailflow.engines.rollout.protocol import Completion
from tailflow.engines.sim.async_engine import AsyncSimEngine, WeightUpdate
from tailflow.engines.sim.simulate import PolicySimulation, SimRound
from tailflow.engines.sim.step_time import NonRolloutCost
from tailflow.engines.tail.completion import RoundResult
from tailflow.engines.tail.state import TailState


@dataclass(frozen=True)
class PipelinedRound:
    """One round of the async pipeline and when each part of it ran (virtual seconds from the run's start)."""

    sim: SimRound
    launch_s: float
    launch_version: int
    """Weights the rollout pool held when the round started."""
    rollout_end_s: float
    train_start_s: float
    train_end_s: float
    published_s: float
    """Version iteration + 1 reaches the rollout pool (train end + weight sync)."""
    prompts_to_train: int
    """P0 of this round: what it counts towards the prompts in flight."""
    launched_problem_ids: tuple[str, ...]
    trained_problem_ids: tuple[str, ...]
    requeued_problem_ids: tuple[str, ...]
    """Completed groups over the staleness bound, sent to the long-prompt queue."""
    staleness: tuple[int, ...]
    """Per trained group: the training step minus the version of its oldest token."""
    reward_s: float
    train_s: float
    sync_s: float
    tokens_restarted: int
    """Tokens thrown away by restarting in-flight requests when a version landed (restart mode)."""


@dataclass(frozen=True)
class TrainingSlot:
    reward_s: float
    train_s: float
    sync_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class AsyncRun:
    rounds: tuple[PipelinedRound, ...]
    num_rollout_replicas: int
    queued_problem_ids: tuple[str, ...]
    """The long-prompt queue at the end: prompts launched but not (yet) trained."""

    @property
    def makespan_s(self) -> float:
        """Start of round 0 to the last round's weights reaching the rollout pool."""
        return self.rounds[-1].published_s

    @property
    def step_s(self) -> float:
        """Mean time per training step, pipeline fill included."""
        return self.makespan_s / len(self.rounds)

    @property
    def rollout_utilisation(self) -> float:
        """Busy replica-seconds of the rollout pool / (replicas x makespan)."""
        busy = sum(r.sim.rollout_s * (1.0 - r.sim.bubble_ratio) for r in self.rounds)
        return busy / self.makespan_s

    @property
    def trainer_utilisation(self) -> float:
        """Share of the makespan the trainer pool trains or sends weights."""
        return sum(r.train_s + r.sync_s for r in self.rounds) / self.makespan_s

    @property
    def staleness_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(s for r in self.rounds for s in r.staleness).items()))

    @property
    def tokens_restarted(self) -> int:
        return sum(r.tokens_restarted for r in self.rounds)


def max_prompts_in_flight(alpha: float, prompts_per_step: int) -> int:
    """ceil(alpha x P0) + P0 (robust to float error, as `launched_prompts`)."""
    return math.ceil(round(alpha * prompts_per_step, 9)) + prompts_per_step


class AsyncPipeline:
    """Runs `sim`'s rounds on its (AsyncSimEngine) replicas and trains them on a separate pool priced by `cost`."""

    def __init__(self, sim: PolicySimulation, cost: NonRolloutCost, alpha: float) -> None:
        if alpha < 0:
            raise ValueError(f"alpha (rollout.async_ratio) must be >= 0, got {alpha}")
        if not all(isinstance(e, AsyncSimEngine) for e in sim.group.engines):
            raise TypeError("the async pipeline needs AsyncSimEngine replicas (versions land mid-round)")
        self.sim, self.cost, self.alpha = sim, cost, alpha
        self.max_in_flight = max_prompts_in_flight(alpha, sim.settings.prompts_per_step)
        self.rounds: list[PipelinedRound] = []
        self.published = [0.0]
        """published[v]: when version v reached the rollout pool (version 0 at the start)."""

    def launch_time(self, iteration: int, prompts_to_train: int) -> float:
        """Earliest start of round `iteration`: pool free, version >= iteration - alpha, prompts in flight capped."""
        needed = max(0, math.ceil(round(iteration - self.alpha, 9)))
        pool_free = self.rounds[-1].rollout_end_s if self.rounds else 0.0
        start = max(pool_free, self.published[needed])
        untrained = sorted((r.published_s, r.prompts_to_train) for r in self.rounds if r.published_s > start)
        in_flight = prompts_to_train + sum(p for _, p in untrained)
        for published_s, prompts in untrained:
            if in_flight <= self.max_in_flight:
                break
            start, in_flight = published_s, in_flight - prompts
        return start

    def run_round(self) -> PipelinedRound:
        iteration = len(self.rounds)
        prepared = self.sim.plan_round()
        launch = self.launch_time(iteration, prepared.plan.prompts_to_complete)
        version = max(v for v, t in enumerate(self.published) if t <= launch)
        offset = launch - self.sim.group.clock_s
        pending = [WeightUpdate(t - offset, v) for v, t in enumerate(self.published) if t > launch]
        engines = self.sim.group.engines
        restarted_before = sum(e.num_tokens_restarted for e in engines)
        for engine in engines:
            engine.begin_round(version, pending)
        record, result = self.sim.finish_round(prepared)
        trained, stale = self._check_staleness(iteration, result, version)
        slot = self._schedule_training(iteration, launch + record.rollout_s, trained)
        pipelined = PipelinedRound(
            sim=record, launch_s=launch, launch_version=version, rollout_end_s=launch + record.rollout_s,
            train_start_s=slot.start_s, train_end_s=slot.end_s, published_s=slot.end_s + slot.sync_s,
            prompts_to_train=prepared.plan.prompts_to_complete,
            launched_problem_ids=tuple(p.problem_id for p in prepared.problems),
            trained_problem_ids=tuple(pid for pid, _, _ in trained), requeued_problem_ids=tuple(stale),
            staleness=tuple(age for _, _, age in trained), reward_s=slot.reward_s, train_s=slot.train_s,
            sync_s=slot.sync_s, tokens_restarted=sum(e.num_tokens_restarted for e in engines) - restarted_before)
        self.rounds.append(pipelined)
        self.published.append(pipelined.published_s)
        return pipelined

    def _check_staleness(self, iteration: int, result: RoundResult,
                         version: int) -> tuple[list[tuple[str, tuple[Completion, ...], int]], list[str]]:
        """The completed groups within the bound (with their staleness), and the problem ids of those over it,
        which join the long-prompt queue."""
        first = {rid: v for e in self.sim.group.engines for rid, v in e.first_version.items()}
        trained, stale = [], []
        for problem_id, completions in result.completed:
            age = iteration - min(first.get(c.request_id, version) for c in completions)
            if age > self.alpha:
                stale.append(problem_id)
            else:
                trained.append((problem_id, completions, age))
        if stale:
            queue = self.sim.tail.long_queue()
            queue.defer(stale, iteration)
            self.sim.tail = TailState(queue=tuple(queue.prompts()), cursor=self.sim.tail.cursor)
        return trained, stale

    def _schedule_training(self, iteration: int, rollout_end_s: float,
                           trained: list[tuple[str, tuple[Completion, ...], int]]) -> TrainingSlot:
        """Reward after the rollout, then training once the trainer has trained and synced the previous round."""
        num_kept = sum(len(cs) for _, cs, _ in trained)
        tokens = sum(len(c.prompt_token_ids) + len(c.token_ids) for _, cs, _ in trained for c in cs)
        reward_s, train_s = self.cost.reward_s(num_kept, tokens), self.cost.train_s(tokens)
        start = max(rollout_end_s + reward_s, self.published[iteration])
        return TrainingSlot(reward_s, train_s, self.cost.weight_sync_s(), start, start + train_s)

    def run_cycles(self, min_rounds: int, max_rounds: int | None = None) -> AsyncRun:
        """At least `min_rounds`, then until the long-prompt queue is empty, at most `max_rounds` (4 x min)."""
        max_rounds = max_rounds or 4 * min_rounds
        while len(self.rounds) < min_rounds or (len(self.sim.tail.queue) and len(self.rounds) < max_rounds):
            self.run_round()
        return AsyncRun(tuple(self.rounds), len(self.sim.group.engines),
                        tuple(q.problem_id for q in self.sim.tail.queue))
