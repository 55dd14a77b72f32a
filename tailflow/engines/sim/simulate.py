"""Run tailflow's own rollout pipeline on simulated replicas, iteration after iteration.

Nothing of the policy is re-implemented here: the rounds are driven by the
product's rollout pipeline (engines/tail/pipeline.py), which plans each with
`begin_round`, runs it under `rule_for(plan)`, settles it into the long-prompt
queue and, at `alpha` >= 1, launches rounds ahead of training under its
staleness bound and in-flight cap, exactly as a run's iterations do. Only the
engines underneath are simulated, and the clock is virtual.

An iteration is the run's (flows/iteration.py): take the round; score it
(the rollout is not polled meanwhile); train it while the pipeline keeps
rolling out (`roll_while` until the virtual clock reaches the end of the
train step); pause the rollout, load the new weights on every replica, resume
(continuing the paused requests from their tokens, or from scratch). With no
trainer cost given, scoring, training and the sync take no time and the clock
moves with rollout only. With `stream_reward` / `stream_train` the round's
observer notes when each response finished and each prompt completed, and the
scoring and the train step run during rollout as the product runs them
(`streamed.py`); what is left of them after the round is what the step waits.
"""
from __future__ import annotations

from dataclasses import dataclass

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.sim.costs import NonRolloutCost
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.sim.placeholder import PlaceholderTokens
from tailflow.engines.sim.sim_run import SimRun, SimStep
from tailflow.engines.sim.streamed import StreamedRound
from tailflow.engines.tail import RoundKind
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings, TailState
from tailflow.engines.tail.taken import TakenRound


@dataclass(frozen=True)
class SimRound:
    """What one simulated rollout round did (per iteration), from the moment the trainer asked for it."""

    iteration: int
    kind: RoundKind
    rollout_s: float
    """From asking for the round to taking it (asynchronous: what is left of it after the overlap)."""
    decode_steps: int
    """Steps of the replica that ran most."""
    tokens_generated: int
    wasted_tokens: int
    num_aborted: int
    num_kept: int
    """Responses trained on."""
    trained_tokens: int
    """Prompt + response tokens of the kept responses: what the trainer computes over."""
    preemptions: int
    replica_idle_ratio: float
    """1 - busy replica-seconds / (replicas x round time): the idle share of the rollout GPUs (the time view;
    `rollout/bubble_ratio` of a run is the slot view: 1 - busy slot-steps / available slot-steps)."""


def take_round(pipeline: RolloutPipeline, group: SimGroup, iteration: int) -> tuple[TakenRound, SimRound]:
    """Take round `iteration` from the pipeline, and what it did on the group's clocks from now until taken."""
    started, preempted = group.clock_s, group.num_preemptions
    busy_before = [e.busy_s for e in group.engines]
    taken = pipeline.take(iteration)
    seconds = group.clock_s - started
    busy_s = sum(e.busy_s - b for e, b in zip(group.engines, busy_before))
    kept = taken.completions
    return taken, SimRound(
        iteration=taken.iteration, kind=taken.planned.plan.kind, rollout_s=seconds,
        decode_steps=taken.stats.max_engine_steps,
        tokens_generated=taken.stats.tokens_generated,
        wasted_tokens=taken.result.wasted_tokens, num_aborted=len(taken.result.aborted_request_ids),
        num_kept=len(kept), trained_tokens=sum(len(c.prompt_token_ids) + len(c.token_ids) for c in kept),
        preemptions=group.num_preemptions - preempted,
        replica_idle_ratio=1.0 - busy_s / (len(group.engines) * seconds) if seconds > 0 else 0.0,
    )


def sim_requests(problems: list[Problem], responses_per_prompt: int, lengths: LengthSource,
                 max_new_tokens: int) -> list[Request]:
    """The round's requests in the real launch order; prompts are placeholders of their length."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return [Request.for_problem(problem.problem_id, k, PlaceholderTokens(lengths.prompt_tokens(problem.problem_id)),
                                params)
            for problem, k in launch_order(problems, responses_per_prompt)]


@dataclass(frozen=True)
class StreamingSettings:
    """What runs during rollout (the run's `reward.streaming` and `train.stream`); off: after it."""

    reward: bool = False
    train: bool = False
    reward_workers: int = 4
    """Reward workers scoring side by side (the config's `reward.max_workers` default)."""

    def __post_init__(self) -> None:
        if self.train and not self.reward:
            raise ValueError("train.stream needs reward.streaming: a group is trained once its responses are scored")

    @property
    def any(self) -> bool:
        return self.reward or self.train


class PolicySimulation:
    """One simulated run: the product's pipeline over simulated replicas; its queue, data cursor, rounds in
    flight and replicas persist across iterations, as in a real run.

    `alpha` and `partial` are the run's `rollout.async_ratio` and `rollout.partial`; `trainer` prices scoring,
    training and the weight sync on the trainer's GPUs (None: free, rollout only)."""

    def __init__(self, settings: TailSettings, lengths: LengthSource, group: SimGroup, alpha: float = 0.0,
                 partial: bool = True, trainer: NonRolloutCost | None = None,
                 streaming: StreamingSettings = StreamingSettings()) -> None:
        self.lengths, self.group, self.trainer = lengths, group, trainer
        self.streaming = streaming
        self.problems = [Problem(problem_id, "", "") for problem_id in lengths.problem_ids()]
        observe = (lambda planned, version: StreamedRound(lambda: group.clock_s)) if streaming.any else None
        self.pipeline = RolloutPipeline(group, settings, alpha, partial, self.problems, self.requests_of, observe)
        self.pipeline.start(TailState())
        self.rounds: list[SimRound] = []
        self.steps: list[SimStep] = []

    def requests_of(self, planned: PlannedRound) -> list[Request]:
        """A round's requests, launched now: their lengths are drawn for this round and pinned."""
        requests = sim_requests(planned.problems, planned.plan.responses_per_prompt, self.lengths,
                                self.lengths.max_new_tokens)
        self.lengths.launch(planned.plan.iteration, requests)
        return requests

    def run_round(self) -> SimRound:
        """The next iteration on the group from its current clock: take its round, then train and sync."""
        started = self.group.clock_s
        taken, record = take_round(self.pipeline, self.group, len(self.rounds))
        self.rounds.append(record)
        self.steps.append(self._train_and_sync(taken, record, started))
        return record

    def _train_and_sync(self, taken: TakenRound, record: SimRound, started_s: float) -> SimStep:
        group, pipeline, trainer = self.group, self.pipeline, self.trainer
        taken_s = group.clock_s
        scored_s, trained_s = self._score_and_train(taken, record, started_s, taken_s)
        group.wait_until(scored_s)  # the rollout is not polled while the scores are collected
        reward_s, train_s = scored_s - taken_s, trained_s - scored_s
        overlap = pipeline.roll_while(lambda: group.clock_s < trained_s)
        group.wait_until(trained_s)
        pipeline.pause()
        restarted = 0 if pipeline.partial else sum(len(c.token_ids) for c in pipeline.paused)
        group.load_weights(taken.iteration + 1)
        sync_s = trainer.weight_sync_s() if trainer else 0.0
        group.wait_until(max(group.clock_s, trained_s) + sync_s)
        pipeline.resume(taken.iteration + 1)
        return SimStep(taken.iteration, started_s, taken_s, trained_s, group.clock_s, reward_s, train_s, sync_s,
                       overlap.tokens, taken.staleness, taken.prompts_in_flight, taken.rounds_ahead, restarted,
                       tuple(p.problem_id for p in taken.planned.problems),
                       tuple(p.problem_id for p in taken.problems))

    def _score_and_train(self, taken: TakenRound, record: SimRound, started_s: float,
                         taken_s: float) -> tuple[float, float]:
        """When the round's scores are all in and when its train step is done (virtual seconds)."""
        trainer, streaming = self.trainer, self.streaming
        if trainer is None:
            return taken_s, taken_s
        tokens = lambda completions: sum(len(c.prompt_token_ids) + len(c.token_ids) for c in completions)
        scored_s = taken_s + trainer.reward_s(record.num_kept, record.trained_tokens)
        scored: dict[str, float] = {}
        if streaming.reward:
            observer = taken.observer_as(StreamedRound)
            scored = observer.scored_at(lambda c: trainer.reward_s(1, tokens([c])), streaming.reward_workers)
            scored_s = max([taken_s] + [scored[c.request_id] for c in taken.completions])
        if not streaming.train:
            return scored_s, scored_s + trainer.train_s(record.trained_tokens)
        observer = taken.observer_as(StreamedRound)
        streamed = observer.trained_at(scored, lambda kept: trainer.train_s(tokens(kept)), started_s)
        return scored_s, max(scored_s, streamed)

    def run_cycles(self, min_rounds: int, max_rounds: int | None = None) -> list[SimRound]:
        """At least `min_rounds`, then until the queue is empty (whole short+long cycles), at most `max_rounds`."""
        max_rounds = max_rounds or 4 * min_rounds
        while len(self.rounds) < min_rounds or (len(self.pipeline.tail.queue) and len(self.rounds) < max_rounds):
            self.run_round()
        return self.rounds

    def run(self, min_rounds: int, max_rounds: int | None = None) -> SimRun:
        """`run_cycles`, summarised as a run: its makespan, pool utilisations and staleness."""
        self.run_cycles(min_rounds, max_rounds)
        return SimRun(tuple(self.steps), tuple(self.rounds), len(self.group.engines),
                      sum(e.busy_s for e in self.group.engines),
                      tuple(q.problem_id for q in self.pipeline.tail.queue))
