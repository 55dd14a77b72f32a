"""The machine half of bench/sim_validate.py: real rounds here, replayed on the `cpu` cost model.

Two real runs of the policy on one in-process `RolloutWorker` (the shipped
warm-start model, the default task, configs/default.yaml's P0, R0, cap and
slots): the synchronous baseline and tail batching, each for whole short+long
cycles, driven by the product's rollout pipeline at alpha 0 (`rounds.RoundsInTurn`:
begin_round -> rule_for -> the pipeline's take -> settle_round), their rounds
interleaved; the weights do not change, so the length profile is the warm
start's. These are rollout runs, not training runs: in-process, so the
engine's own CPU time can be measured, and without Ray round trips or
training, which the simulator does not model. Each round's trace (the product's
`trace_of` of the round the pipeline handed over) is then replayed on a
simulated engine with the cpu model (`research/replay.py`), and the two times
are compared.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import mean, median
from typing import Any

from rounds import RoundsInTurn
from research.replay import replay_on

from tailflow.engines.rollout.worker import LocalRollout
from tailflow.engines.sim.calibrate import step_clock
from tailflow.engines.sim.table_cost import TableCost
from tailflow.engines.tail import RoundPlan
from tailflow.engines.tail.state import TailSettings
from tailflow.engines.track.rollout_trace import TraceRound, trace_of


@dataclass(frozen=True)
class CpuWorkload:
    worker: Any
    """In-process RolloutWorker."""
    tokenizer: Any
    problems: list
    params: Any
    prompts_per_step: int
    responses_kept: int
    responses_launched: int
    prompt_ratio: float
    num_slots: int
    steps_per_poll: int
    seed: int
    num_threads: int


@dataclass(frozen=True)
class MeasuredRound:
    plan: RoundPlan
    trace: TraceRound
    """Its `generate_s` is the wall-clock time."""
    steps: int
    engine_s: float
    """The round timed by the calibration's clock (one thread: the engine thread's CPU time; see calibrate.py)."""


class PolicyRun:
    """One real run of the policy (synchronous or tail batching), a round at a time, each timed and traced."""

    def __init__(self, w: CpuWorkload, enabled: bool) -> None:
        from tailflow.engines.rollout.requests import sampling_requests

        self.w, self.enabled, self.rounds = w, enabled, []
        settings = TailSettings(prompts_per_step=w.prompts_per_step, responses_kept=w.responses_kept,
                                prompt_ratio=w.prompt_ratio, responses_launched=w.responses_launched,
                                enabled=enabled, data_seed=w.seed, steps_per_poll=w.steps_per_poll)
        make_requests = lambda planned: sampling_requests(planned.problems, planned.plan.responses_per_prompt,
                                                          w.params, w.tokenizer, w.seed, planned.plan.iteration)
        self.driver = RoundsInTurn(LocalRollout(w.worker), settings, w.problems, make_requests)

    def is_done(self, min_rounds: int) -> bool:
        """At least min_rounds, and whole cycles: every deferred prompt has had its long round."""
        return len(self.rounds) >= min_rounds and (not len(self.driver.tail.queue) or
                                                   len(self.rounds) >= 4 * min_rounds)

    def run_round(self) -> MeasuredRound:
        clock = step_clock(self.w.num_threads)
        engine_started = clock()
        taken = self.driver.take()
        engine_s = clock() - engine_started
        trace = trace_of(taken, self.w.params.max_new_tokens)
        self.rounds.append(MeasuredRound(taken.planned.plan, trace, taken.stats.max_engine_steps, engine_s))
        return self.rounds[-1]


def run_interleaved(runs: list[PolicyRun], min_rounds: int, calibration=None) -> None:
    """Round k of every run, then round k+1, so load from elsewhere on the machine hits all runs alike; a
    calibration sweep before, half way and after, so the cost model sees that load too."""
    if calibration is not None:
        calibration.sweep()
    while not all(run.is_done(min_rounds) for run in runs):
        for run in runs:
            if not run.is_done(min_rounds):
                run.run_round()
        if calibration is not None and len(runs[0].rounds) == max(min_rounds // 2, 1) and len(calibration.sweeps) == 1:
            calibration.sweep()
    if calibration is not None:
        calibration.sweep()


@dataclass(frozen=True)
class ReplayedRound:
    measured: MeasuredRound
    predicted_s: float
    steps: int

    @property
    def measured_s(self) -> float:
        return self.measured.engine_s

    @property
    def wall_s(self) -> float:
        return self.measured.trace.generate_s

    @property
    def rel_err(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s


def replay(rounds: list[MeasuredRound], cost: TableCost, w: CpuWorkload) -> list[ReplayedRound]:
    """Each real round again on a simulated engine fed its own trace, under the same plan and rule."""
    replayed = replay_on([r.trace for r in rounds], cost, 1, w.num_slots, w.prompts_per_step, w.responses_kept,
                         steps_per_poll=w.steps_per_poll)
    return [ReplayedRound(measured, sim.rollout_s, sim.decode_steps) for measured, sim in zip(rounds, replayed)]


@dataclass(frozen=True)
class CpuValidation:
    sync: list[ReplayedRound]
    tail: list[ReplayedRound]

    @property
    def all_rounds(self) -> list[ReplayedRound]:
        return self.sync + self.tail

    @property
    def median_rel_err(self) -> float:
        return median(r.rel_err for r in self.all_rounds)

    @property
    def measured_ratio(self) -> float:
        """tail / sync mean generate time per round (tail over whole cycles)."""
        return mean(r.measured_s for r in self.tail) / mean(r.measured_s for r in self.sync)

    @property
    def predicted_ratio(self) -> float:
        return mean(r.predicted_s for r in self.tail) / mean(r.predicted_s for r in self.sync)

    @property
    def ratio_err(self) -> float:
        return abs(self.predicted_ratio - self.measured_ratio)

    @property
    def steps_match(self) -> bool:
        return all(r.steps == r.measured.steps for r in self.all_rounds)


def print_cpu_table(validation: CpuValidation) -> None:
    print(f"{'run':6s}{'round':>6s}{'kind':>7s}{'measured s':>12s}{'predicted s':>13s}{'rel err':>9s}"
          f"{'wall s':>9s}{'steps real/sim':>16s}")
    for name, rounds in (("sync", validation.sync), ("tail", validation.tail)):
        for r in rounds:
            print(f"{name:6s}{r.measured.plan.iteration:6d}{r.measured.plan.kind.value:>7s}{r.measured_s:12.2f}"
                  f"{r.predicted_s:13.2f}{r.rel_err:9.1%}{r.wall_s:9.2f}{r.measured.steps:>9d}/{r.steps:<6d}")
