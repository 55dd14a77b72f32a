"""Tail batching's real round code on the real engine, with response lengths forced from a paper-like trace.

The policy is tailflow's own, driven by the product's rollout pipeline at
alpha 0 (`rounds.RoundsInTurn`): `begin_round` plans each round, the pipeline
runs it under `rule_for(plan)` (aborting what the rule says), `settle_round`
queues the prompts it gave up on. Only the lengths are forced: every request's
`max_new_tokens` is its draw from `PaperLikeLengths` (EOS off), so a response
stops exactly at its trace length and the synchronous and tail-batching runs
generate the same kind of work. Prompts are random token ids of the trace's
prompt lengths. Time is the wall clock around the pipeline's `take` (each step
ends in a device sync), so it is the rollout time a GPU really spends.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Sequence

from rounds import RoundsInTurn

from tailflow.engines.data.problem import Problem
from tailflow.engines.rollout import NativeEngine, Request, RolloutWorker, SamplingParams
from tailflow.engines.rollout.worker import LocalRollout
from tailflow.engines.sim.lengths import seeded_rng
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.tail import RoundKind, TailSettings
from tailflow.engines.tail.launch import launch_order


class ForcedLengthRollout(RolloutWorker):
    """A `RolloutWorker` (the in-process worker a round drives) whose requests stop at their trace length (each
    request's length is pinned when its round launches it)."""

    def __init__(self, engine: NativeEngine, lengths: PaperLikeLengths) -> None:
        self._attach(engine)
        self.lengths = lengths

    def forced(self, requests: Sequence[Request]) -> list[Request]:
        return [replace(r, params=replace(r.params, max_new_tokens=self.lengths.length_of(r).num_tokens))
                for r in requests]

    def generate(self, requests: Sequence[Request]):
        return super().generate(self.forced(requests))

    def submit(self, requests: Sequence[Request]) -> None:
        super().submit(self.forced(requests))


@dataclass(frozen=True)
class MeasuredRound:
    iteration: int
    kind: RoundKind
    seconds: float
    decode_steps: int
    tokens: int
    queue_after: int


def round_requests(problems: list[Problem], responses: int, lengths: PaperLikeLengths, vocab: int,
                   max_new_tokens: int) -> list[Request]:
    """Response k of each problem in the real launch order; each prompt's ids are a seeded draw of its trace
    length."""
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    prompt_ids = {}
    for problem in problems:
        rng = seeded_rng("prompt-ids", problem.problem_id)
        prompt_ids[problem.problem_id] = tuple(rng.randrange(vocab) for _ in range(lengths.prompt_tokens(problem.problem_id)))
    return [Request.for_problem(problem.problem_id, k, prompt_ids[problem.problem_id], params)
            for problem, k in launch_order(problems, responses)]


def run_policy(engine: NativeEngine, lengths: PaperLikeLengths, settings: TailSettings, num_rounds: int,
               synchronize) -> list[MeasuredRound]:
    """`num_rounds` rounds, then on until the long-prompt queue is empty (whole short + long cycles)."""
    def make_requests(planned) -> list[Request]:
        requests = round_requests(planned.problems, planned.plan.responses_per_prompt, lengths, engine.vocab_size,
                                  lengths.max_new_tokens)
        lengths.launch(planned.plan.iteration, requests)
        return requests

    problems = [Problem(problem_id, "", "") for problem_id in lengths.problem_ids()]
    driver = RoundsInTurn(LocalRollout(ForcedLengthRollout(engine, lengths)), settings, problems, make_requests)
    rounds: list[MeasuredRound] = []
    while len(rounds) < num_rounds or (driver.tail.queue and len(rounds) < 4 * num_rounds):
        synchronize()
        started = time.perf_counter()
        taken = driver.take()
        seconds = time.perf_counter() - started
        rounds.append(MeasuredRound(len(rounds), taken.planned.plan.kind, seconds, taken.stats.max_engine_steps,
                                    taken.stats.tokens_generated, len(driver.tail.queue)))
    return rounds


@dataclass(frozen=True)
class RoundComparison:
    sync: list[MeasuredRound]
    tail: list[MeasuredRound]

    def mean_s(self, rounds: list[MeasuredRound], kind: RoundKind | None = None) -> float:
        chosen = [r.seconds for r in rounds if kind is None or r.kind == kind]
        return statistics.mean(chosen) if chosen else float("nan")

    @property
    def speedup(self) -> float:
        """Mean synchronous round time over mean tail-batching round time, long rounds amortised in."""
        return self.mean_s(self.sync) / self.mean_s(self.tail)


def compare_rounds(engine: NativeEngine, prompts_per_step: int, responses_kept: int, responses_launched: int,
                   prompt_ratio: float, max_new_tokens: int, num_rounds: int, synchronize,
                   seed: int = 0) -> RoundComparison:
    """The synchronous baseline and tail batching on the same engine, trace and seeds."""
    def settings(enabled: bool) -> TailSettings:
        return TailSettings(prompts_per_step=prompts_per_step, responses_kept=responses_kept,
                            prompt_ratio=prompt_ratio, responses_launched=responses_launched, enabled=enabled,
                            data_seed=seed, steps_per_poll=4)

    num_prompts = 8 * prompts_per_step * num_rounds
    runs = {}
    for enabled in (False, True):
        lengths = PaperLikeLengths(num_prompts, max_new_tokens, seed=seed)
        runs[enabled] = run_policy(engine, lengths, settings(enabled), num_rounds, synchronize)
    return RoundComparison(sync=runs[False], tail=runs[True])


def describe(comparison: RoundComparison) -> list[str]:
    lines = [f"{'run':5} {'round':>5} {'kind':6} {'seconds':>8} {'steps':>6} {'tokens':>7} {'queue':>5}"]
    for name, rounds in (("sync", comparison.sync), ("tail", comparison.tail)):
        lines += [f"{name:5} {r.iteration:5d} {r.kind.value:6} {r.seconds:8.3f} {r.decode_steps:6d} {r.tokens:7d} "
                  f"{r.queue_after:5d}" for r in rounds]
    c = comparison
    lines.append(f"mean round: sync {c.mean_s(c.sync):.3f} s; tail {c.mean_s(c.tail):.3f} s "
                 f"(short {c.mean_s(c.tail, RoundKind.SHORT):.3f} s, long {c.mean_s(c.tail, RoundKind.LONG):.3f} s)")
    lines.append(f"RESULT rollout_speedup={c.speedup:.3f}")
    return lines
