"""Replay a run's traced rounds, as they happened, on another cost model (a GPU preset, or this machine's).

Each traced round is run again with the prompts it launched (in the policy's
launch order), its kind's completion rule and the run's P0 and R0, every
request taking the length it had (aborted ones: imputed, see `imputed_length`).
The rule decides afresh on the new engines, so a short round may keep other
responses than the run did; which prompts each round launched is the run's.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.rollout.protocol import FinishReason, Request, SamplingParams
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import LengthSource, ResponseLength
from tailflow.engines.sim.placeholder import PlaceholderTokens
from tailflow.engines.data.problem import Problem
from tailflow.engines.sim.simulate import SimRound, take_round
from tailflow.engines.sim.trace import finished_lengths
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.pipeline import RolloutPipeline
from tailflow.engines.tail.planner import RoundKind, RoundPlan
from tailflow.engines.tail.round import PlannedRound
from tailflow.engines.tail.state import TailSettings, TailState
from tailflow.engines.track.rollout_trace import TraceRound


def imputed_length(partial: int, prompt_lengths: Sequence[int], max_new_tokens: int) -> ResponseLength:
    """An aborted response's length is censored: the prompt's longest finished response if that is longer
    than the partial, else the cap (the rule stopped it, so all we know is that it was still going)."""
    longest = max(prompt_lengths, default=0)
    if longest > partial and longest < max_new_tokens:
        return ResponseLength(longest, FinishReason.EOS)
    return ResponseLength(max_new_tokens, FinishReason.LENGTH)


class TraceLengths(LengthSource):
    """Replay: response k of a problem in round `iteration` gets exactly the length it had in the trace."""

    def __init__(self, rounds: Sequence[TraceRound]) -> None:
        super().__init__()
        self.rounds = {r.iteration: r for r in rounds}
        self.max_new_tokens = max(r.max_new_tokens for r in rounds)
        pools = finished_lengths(rounds)
        self._lengths: dict[tuple[int, str, int], ResponseLength] = {}
        self._prompt_tokens: dict[str, int] = {}
        for trace_round in rounds:
            for prompt in trace_round.prompts:
                self._prompt_tokens[prompt.problem_id] = prompt.prompt_tokens
                for r in prompt.responses:
                    length = (imputed_length(r.length, pools.get(prompt.problem_id, []), trace_round.max_new_tokens)
                              if r.finish == "abort" else ResponseLength(r.length, FinishReason(r.finish)))
                    self._lengths[trace_round.iteration, prompt.problem_id, r.index] = length

    def problem_ids(self) -> list[str]:
        return list(self._prompt_tokens)

    def prompt_tokens(self, problem_id: str) -> int:
        return self._prompt_tokens[problem_id]

    def draw(self, iteration: int, request: Request) -> ResponseLength:
        if iteration not in self.rounds:
            raise KeyError(f"the trace has no round {iteration}")
        try:
            return self._lengths[iteration, request.problem_id, request.index]
        except KeyError:
            raise KeyError(f"round {iteration} of the trace never launched {request.request_id!r}") from None


def traced_requests(trace_round: TraceRound) -> list[Request]:
    params = SamplingParams(max_new_tokens=trace_round.max_new_tokens)
    per_prompt = max(len(p.responses) for p in trace_round.prompts)
    launched = {(p.problem_id, r.index) for p in trace_round.prompts for r in p.responses}
    return [Request.for_problem(p.problem_id, k, PlaceholderTokens(p.prompt_tokens), params)
            for p, k in launch_order(trace_round.prompts, per_prompt) if (p.problem_id, k) in launched]


def traced_plan(trace_round: TraceRound, prompts_per_step: int, responses_kept: int) -> RoundPlan:
    kind = RoundKind(trace_round.round)
    per_prompt = max(len(p.responses) for p in trace_round.prompts)
    return RoundPlan(kind, trace_round.iteration, len(trace_round.prompts) if kind is not RoundKind.LONG else 0, (),
                     per_prompt, responses_kept, prompts_per_step)


def replay_rounds(rounds: Sequence[TraceRound], group: SimGroup, prompts_per_step: int, responses_kept: int,
                  steps_per_poll: int = 2) -> list[SimRound]:
    """`group` must draw its lengths from `TraceLengths(rounds)` (`replay_on` builds both). The rounds run on the
    product's pipeline, planned as the trace says instead of by the data cursor."""
    lengths = group.engines[0].lengths
    by_iteration = {r.iteration: r for r in rounds}
    planned = {r.iteration: PlannedRound(traced_plan(r, prompts_per_step, responses_kept),
                                         [Problem(p.problem_id, "", "") for p in r.prompts], TailState())
               for r in rounds}

    def requests_of(planned_round: PlannedRound) -> list[Request]:
        requests = traced_requests(by_iteration[planned_round.plan.iteration])
        lengths.launch(planned_round.plan.iteration, requests)
        return requests

    settings = TailSettings(prompts_per_step, responses_kept, steps_per_poll=steps_per_poll)
    pipeline = RolloutPipeline(group, settings, 0.0, False, [], requests_of,
                               plan=lambda tail, j, live: planned[j])
    replayed = []
    for trace_round in rounds:
        pipeline.start(TailState(), trace_round.iteration)
        replayed.append(take_round(pipeline, group, trace_round.iteration)[1])
    return replayed


def replay_on(rounds: Sequence[TraceRound], cost, num_replicas: int, num_slots: int, prompts_per_step: int,
              responses_kept: int, kv_budget_tokens: int | None = None, steps_per_poll: int = 2) -> list[SimRound]:
    group = SimGroup.of(cost, TraceLengths(rounds), num_replicas, num_slots, kv_budget_tokens)
    return replay_rounds(rounds, group, prompts_per_step, responses_kept, steps_per_poll)
