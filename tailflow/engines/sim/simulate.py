"""Run tailflow's own tail-batching policy on simulated replicas, round after round.

Nothing of the policy is re-implemented here: the rounds are driven by the
product's own rollout pipeline (engines/tail/pipeline.py), which plans each
with `begin_round`, runs it under `rule_for(plan)` and settles it into the
long-prompt queue, exactly as a run's iterations do. Only the engine
underneath is simulated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.sim.engine import PlaceholderTokens
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.tail import RoundKind
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings, TailState
from tailflow.engines.tail.taken import TakenRound


@dataclass(frozen=True)
class SimRound:
    """What one simulated rollout round did (per iteration)."""

    iteration: int
    kind: RoundKind
    rollout_s: float
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


def sim_round(taken: TakenRound, group: SimGroup, seconds: float, busy_s: float, preemptions: int) -> SimRound:
    """What a simulated round did, from the round the pipeline handed over and the group's clocks."""
    kept = taken.completions
    return SimRound(
        iteration=taken.iteration, kind=taken.planned.plan.kind, rollout_s=seconds,
        decode_steps=taken.stats.max_engine_steps,
        tokens_generated=taken.stats.tokens_generated,
        wasted_tokens=taken.result.wasted_tokens, num_aborted=len(taken.result.aborted_request_ids),
        num_kept=len(kept), trained_tokens=sum(len(c.prompt_token_ids) + len(c.token_ids) for c in kept),
        preemptions=preemptions,
        replica_idle_ratio=1.0 - busy_s / (len(group.engines) * seconds) if seconds > 0 else 0.0,
    )


def sim_requests(problems: list[Problem], responses_per_prompt: int, lengths: LengthSource,
                 max_new_tokens: int) -> list[Request]:
    """The round's requests in the real launch order; prompts are placeholders of their length."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return [Request.for_problem(problem.problem_id, k, PlaceholderTokens(lengths.prompt_tokens(problem.problem_id)),
                                params)
            for problem, k in launch_order(problems, responses_per_prompt)]


class PolicySimulation:
    """One simulated run: the product's pipeline over simulated replicas; its queue, data cursor and replicas
    persist across rounds, as in a real run. Synchronous rounds (the weights never change in a simulation)."""

    def __init__(self, settings: TailSettings, lengths: LengthSource, group: SimGroup) -> None:
        self.settings = settings
        self.lengths = lengths
        self.group = group
        self.problems = [Problem(problem_id, "", "") for problem_id in lengths.problem_ids()]
        self.problems_by_id = {problem.problem_id: problem for problem in self.problems}
        self.pipeline = RolloutPipeline(group, settings, 0.0, False, self.problems, self.problems_by_id,
                                        self.requests_of)
        self.pipeline.start(TailState())
        self.rounds: list[SimRound] = []

    @property
    def tail(self) -> TailState:
        return self.pipeline.tail

    def requests_of(self, planned: PlannedRound) -> list[Request]:
        """A round's requests, launched now: its lengths come from the length source's round."""
        self.lengths.begin_round(planned.plan.iteration)
        return sim_requests(planned.problems, planned.plan.responses_per_prompt, self.lengths,
                            self.lengths.max_new_tokens)

    def run_round(self) -> SimRound:
        """The next round on the group from its current clock."""
        iteration, group = len(self.rounds), self.group
        started, preempted = group.clock_s, group.num_preemptions
        busy_before = [e.busy_s for e in group.engines]
        taken = self.pipeline.take(iteration)
        self.pipeline.pause()
        self.pipeline.resume(iteration + 1)  # nothing in flight: the next round may launch
        busy = sum(e.busy_s - b for e, b in zip(group.engines, busy_before))
        record = sim_round(taken, group, group.clock_s - started, busy, group.num_preemptions - preempted)
        self.rounds.append(record)
        return record

    def run_cycles(self, min_rounds: int, max_rounds: int | None = None) -> list[SimRound]:
        """At least `min_rounds`, then until the queue is empty (whole short+long cycles), at most `max_rounds`."""
        max_rounds = max_rounds or 4 * min_rounds
        while len(self.rounds) < min_rounds or (len(self.tail.queue) and len(self.rounds) < max_rounds):
            self.run_round()
        return self.rounds


def simulate_policy(settings: TailSettings, lengths: LengthSource, make_group: Callable[[], SimGroup],
                    min_rounds: int, max_rounds: int | None = None) -> list[SimRound]:
    return PolicySimulation(settings, lengths, make_group()).run_cycles(min_rounds, max_rounds)
