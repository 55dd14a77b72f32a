"""Run tailflow's own tail-batching policy on simulated replicas, round after round.

Nothing of the policy is re-implemented here: each round is planned by
`begin_round` (which calls `make_round_plan` and draws from the data cursor),
driven by `run_round` under `rule_for(plan)`, and settled by `settle_round`
(its stragglers join the long-prompt queue of the same `TailState`), exactly
as `flows/iteration.py` and `bench/sensitivity.py` do. Only the engine
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
from tailflow.engines.tail import RoundKind, RoundPlan, RoundResult, rule_for
from tailflow.engines.tail.driver import run_round
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.round import PlannedRound, begin_round, settle_round
from tailflow.engines.tail.state import TailSettings, TailState


@dataclass(frozen=True)
class PolicySettings:
    """The tail-batching knobs of one simulated run (the config's data/rollout/tail fields)."""

    prompts_per_step: int
    """P0."""
    responses_kept: int
    """R0."""
    prompt_ratio: float = 1.25
    responses_launched: int | None = None
    """None: R0 (no response speculation)."""
    enabled: bool = True
    """False: the synchronous baseline."""
    steps_per_poll: int = 2
    data_seed: int = 0

    @property
    def launched(self) -> int:
        return self.responses_launched or self.responses_kept

    def tail_settings(self) -> TailSettings:
        return TailSettings(prompts_per_step=self.prompts_per_step, responses_kept=self.responses_kept,
                            prompt_ratio=self.prompt_ratio, responses_launched=self.launched, enabled=self.enabled,
                            data_seed=self.data_seed, steps_per_poll=self.steps_per_poll)


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
    bubble_ratio: float
    """1 - busy replica-seconds / (replicas x round time): the idle share of the rollout GPUs."""


def simulate_round(group: SimGroup, plan: RoundPlan, requests: list[Request],
                   steps_per_poll: int) -> tuple[SimRound, RoundResult]:
    """One round of `plan` on `group` under the real driver and rule, and what it did."""
    before, started = group.stats(), group.clock_s
    busy_before, preempted_before = [e.busy_s for e in group.engines], group.num_preemptions
    result = run_round(group, requests, rule_for(plan, requests), steps_per_poll)
    after, seconds = group.stats(), group.clock_s - started
    busy = sum(e.busy_s - b for e, b in zip(group.engines, busy_before))
    kept = [c for _, completions in result.completed for c in completions]
    record = SimRound(
        iteration=plan.iteration, kind=plan.kind, rollout_s=seconds,
        decode_steps=max(a.steps - b.steps for a, b in zip(after, before)),
        tokens_generated=sum(a.tokens_generated - b.tokens_generated for a, b in zip(after, before)),
        wasted_tokens=result.wasted_tokens, num_aborted=len(result.aborted_request_ids), num_kept=len(kept),
        trained_tokens=sum(len(c.prompt_token_ids) + len(c.token_ids) for c in kept),
        preemptions=group.num_preemptions - preempted_before,
        bubble_ratio=1.0 - busy / (len(group.engines) * seconds) if seconds > 0 else 0.0,
    )
    return record, result


def sim_requests(problems: list[Problem], responses_per_prompt: int, lengths: LengthSource,
                 max_new_tokens: int) -> list[Request]:
    """The round's requests, `<problem>#<k>` in the real launch order; prompts are placeholders of their length."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return [Request(f"{problem.problem_id}#{k}", PlaceholderTokens(lengths.prompt_tokens(problem.problem_id)), params)
            for problem, k in launch_order(problems, responses_per_prompt)]


class PolicySimulation:
    """One simulated run: its queue, data cursor and replicas persist across rounds, as in a real run."""

    def __init__(self, settings: PolicySettings, lengths: LengthSource, group: SimGroup) -> None:
        self.settings = settings
        self.lengths = lengths
        self.group = group
        self.problems = [Problem(problem_id, "", "") for problem_id in lengths.problem_ids()]
        self.problems_by_id = {problem.problem_id: problem for problem in self.problems}
        self.tail = TailState()
        self.rounds: list[SimRound] = []

    def run_round(self) -> SimRound:
        return self.finish_round(self.plan_round())[0]

    def plan_round(self) -> PlannedRound:
        """The next round's plan and prompts (the queue and cursor move only in `finish_round`)."""
        return begin_round(self.tail, len(self.rounds), self.settings.tail_settings(), self.problems,
                           self.problems_by_id)

    def finish_round(self, prepared: PlannedRound) -> tuple[SimRound, RoundResult]:
        """Run a planned round on the group from its current clock, and settle it.

        Split from planning so a caller (the async pipeline) can choose when, in virtual time, it starts."""
        plan = prepared.plan
        self.lengths.begin_round(plan.iteration)
        requests = sim_requests(prepared.problems, plan.responses_per_prompt, self.lengths,
                                self.lengths.max_new_tokens)
        record, result = simulate_round(self.group, plan, requests, self.settings.steps_per_poll)
        self.tail = settle_round(prepared, result)
        self.rounds.append(record)
        return record, result

    def run_cycles(self, min_rounds: int, max_rounds: int | None = None) -> list[SimRound]:
        """At least `min_rounds`, then until the queue is empty (whole short+long cycles), at most `max_rounds`."""
        max_rounds = max_rounds or 4 * min_rounds
        while len(self.rounds) < min_rounds or (len(self.tail.queue) and len(self.rounds) < max_rounds):
            self.run_round()
        return self.rounds


def simulate_policy(settings: PolicySettings, lengths: LengthSource, make_group: Callable[[], SimGroup],
                    min_rounds: int, max_rounds: int | None = None) -> list[SimRound]:
    return PolicySimulation(settings, lengths, make_group()).run_cycles(min_rounds, max_rounds)
