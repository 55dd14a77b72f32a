"""Replay a run's traced rounds, as they happened, on another cost model (a GPU preset, say).

Each traced round is run again with the prompts it launched (in the policy's
launch order), its kind's completion rule and the run's P0 and R0, every
request taking the length it had (aborted ones: imputed, see trace.py). The
rule decides afresh on the new engines, so a short round may keep other
responses than the run did; which prompts each round launched is the run's.
"""
from __future__ import annotations

from typing import Sequence

from tailflow.engines.rollout.protocol import Request, SamplingParams
from tailflow.engines.sim.engine import PlaceholderTokens
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.simulate import SimRound, simulate_round
from tailflow.engines.sim.trace import TraceLengths, TraceRound
from tailflow.engines.tail.launch import launch_order
from tailflow.engines.tail.planner import RoundKind, RoundPlan


def traced_requests(trace_round: TraceRound) -> list[Request]:
    params = SamplingParams(max_new_tokens=trace_round.max_new_tokens)
    per_prompt = max(len(p.responses) for p in trace_round.prompts)
    launched = {(p.problem_id, r.index) for p in trace_round.prompts for r in p.responses}
    return [Request(f"{p.problem_id}#{k}", PlaceholderTokens(p.prompt_tokens), params)
            for p, k in launch_order(trace_round.prompts, per_prompt) if (p.problem_id, k) in launched]


def traced_plan(trace_round: TraceRound, prompts_per_step: int, responses_kept: int) -> RoundPlan:
    kind = RoundKind(trace_round.round)
    per_prompt = max(len(p.responses) for p in trace_round.prompts)
    return RoundPlan(kind, trace_round.iteration, len(trace_round.prompts) if kind is not RoundKind.LONG else 0, (),
                     per_prompt, responses_kept, prompts_per_step)


def replay_rounds(rounds: Sequence[TraceRound], group: SimGroup, prompts_per_step: int, responses_kept: int,
                  steps_per_poll: int = 2) -> list[SimRound]:
    """`group` must draw its lengths from `TraceLengths(rounds)` (`replay_on` builds both)."""
    lengths = group.engines[0].lengths
    replayed = []
    for trace_round in rounds:
        lengths.begin_round(trace_round.iteration)
        plan = traced_plan(trace_round, prompts_per_step, responses_kept)
        replayed.append(simulate_round(group, plan, traced_requests(trace_round), steps_per_poll)[0])
    return replayed


def replay_on(rounds: Sequence[TraceRound], cost, num_replicas: int, num_slots: int, prompts_per_step: int,
              responses_kept: int, kv_budget_tokens: int | None = None, steps_per_poll: int = 2) -> list[SimRound]:
    group = SimGroup.of(cost, TraceLengths(rounds), num_replicas, num_slots, kv_budget_tokens)
    return replay_rounds(rounds, group, prompts_per_step, responses_kept, steps_per_poll)
