"""`tailflow plan`: which tail-batching settings to use on a cluster, and what they save, from a trace.

Every setting of the grid (prompt ratio x responses launched; the paper's
Figure 11 grid, or a finer one) runs the product's pipeline on simulated
replicas for whole short+long cycles, from the same lengths and seed; the
synchronous baseline runs the same way. Per setting: rollout time per step
(long rounds amortised over their period), step time (rollout + reward + train
+ weight sync, priced by `pricing.py`'s flag), speedup over synchronous, how
often a long round comes, wasted tokens, KV preemptions. Then the rollout TP
for short and long rounds: the recommended setting again at every TP (powers
of two to 16; past 8 the all-reduces cross nodes), keeping the best TP for
each round kind. A setting that cannot run (a request that can never fit a
replica's KV budget, weights that do not fit at that TP) is a row saying why,
never an error. Settings run side by side on `jobs` processes. With an agentic
run's trace, `env_schedule_plan` predicts its environment schedules on the same
cluster and cost model (`agentic.py`).
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from statistics import mean
from typing import Callable, Sequence

from tailflow.engines.sim.agentic import SimTrajectory, compare_schedules, rows_per_replica, schedule_table
from tailflow.engines.sim.costs import CostModel, CostModelError, Infeasible, NonRolloutCost
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.sim.presets import hardware_preset, model_preset
from tailflow.engines.sim.pricing import step_pricing
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySimulation, StreamingSettings
from tailflow.engines.sim.sim_run import SimRun
from tailflow.engines.sim.step_time import PAPER_TABLE1, StageShares, mean_step_time
from tailflow.engines.sim.table_cost import TableCost
from tailflow.engines.sim.trace import sample_trajectories
from tailflow.engines.tail.planner import ceil_product
from tailflow.engines.tail.state import TailSettings

PAPER_FACTORS = (1.0, 1.125, 1.25, 1.5)
"""Figure 11: eta for the prompt ratio and for responses (ceil(eta x R0))."""
FINE_PROMPT_RATIOS = (1.0, 1.0625, 1.125, 1.1875, 1.25, 1.3125, 1.375, 1.4375, 1.5)
NUM_SLOTS = 2048
"""Slots per replica (vLLM's max_num_seqs in RollPacker's config): the KV budget is what limits a replica."""
TP_CANDIDATES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for: the cluster, the policy's fixed sizes, the search, the pricing."""

    num_gpus: int
    hardware: str
    model: str
    tp: int
    prompts_per_step: int
    responses_kept: int
    grid: str = "paper"
    """`paper` (Figure 11's 4 x 4) or `fine` (9 prompt ratios x every response count from R0 to 1.5 R0)."""
    rounds: int = 10
    """Simulated rounds per setting at least (then until the queue is empty: whole cycles)."""
    steps_per_poll: int = 2
    seed: int = 0
    pricing: str = "shares"
    """How reward and train are priced (`pricing.py`): shares, roofline or measured."""
    shares: StageShares = PAPER_TABLE1
    streaming: StreamingSettings = StreamingSettings()
    """Scoring and the stream trainer during rollout (off: after it, the paper's "+ tail batching" step)."""
    measured_path: str | None = None
    """A `measured` calibration file (docs/simulator.md): its step costs, TP and KV budget replace the roofline's
    for rollout; no TP search."""
    jobs: int | None = None
    """Processes simulating settings side by side (None: one per CPU)."""

    def settings(self) -> list[tuple[float, int]]:
        r0 = self.responses_kept
        if self.grid == "paper":
            return [(p, ceil_product(f, r0)) for p in PAPER_FACTORS for f in PAPER_FACTORS]
        if self.grid == "fine":
            return [(p, r) for p in FINE_PROMPT_RATIOS for r in range(r0, math.ceil(1.5 * r0) + 1)]
        raise ValueError(f"--grid: unknown grid {self.grid!r}; known: paper, fine")


@dataclass(frozen=True)
class PlanCell:
    prompt_ratio: float
    responses_launched: int
    rollout_s: float = math.nan
    """Mean rollout time per step over whole cycles."""
    step_s: float = math.nan
    speedup: float = math.nan
    """Synchronous step time / this step time."""
    long_round_share: float = math.nan
    wasted_tokens: float = math.nan
    """Per step."""
    preemptions: float = math.nan
    """KV preemptions per step."""
    infeasible: str = ""
    """Why this setting cannot run (empty: it ran)."""


@dataclass(frozen=True)
class TpChoice:
    tp: int
    short_round_s: float = math.nan
    long_round_s: float = math.nan
    preemptions_short: float = math.nan
    preemptions_long: float = math.nan
    infeasible: str = ""


@dataclass(frozen=True)
class PlanResult:
    """What `plan` found for a `PlanRequest`: every setting's cell beside the synchronous baseline, the
    recommendation, the rollout TP at it; `cost`, `lengths` and `pricing` say what it was computed from.
    `plan_pages.py` writes it for a person (table, plan.md, heatmap)."""

    request: PlanRequest
    cost: str
    lengths: str
    pricing: str
    baseline: PlanCell
    cells: list[PlanCell]
    recommended: PlanCell | None
    """The fastest feasible setting; None when none could run."""
    tp_choices: list[TpChoice]


def smallest_tp(hardware: str, model: str, num_gpus: int, request_tokens: int = 1) -> int:
    """The smallest power-of-two TP (up to 8) whose replica holds the weights and a KV budget of at least one
    request of `request_tokens` (prompt + cap); the largest that divides the GPUs if none does (the plan then
    reports why nothing runs, TP by TP)."""
    hardware_preset(hardware), model_preset(model)  # an unknown name is its own error, not "fits no TP"
    tps = [tp for tp in (1, 2, 4, 8) if num_gpus % tp == 0]
    for tp in tps:
        try:
            if RooflineCost.from_presets(hardware, model, num_gpus, tp).kv_budget_tokens > request_tokens:
                return tp
        except Infeasible:
            continue
    return tps[-1]


def make_cost(request: PlanRequest, tp: int) -> RooflineCost:
    return RooflineCost.from_presets(request.hardware, request.model, request.num_gpus, tp)


@dataclass(frozen=True)
class RolloutCluster:
    """What rollout runs on: a cost model, how many replicas, each one's KV budget."""

    cost: CostModel
    num_replicas: int
    kv_budget_tokens: int
    description: str


def rollout_cluster(request: PlanRequest, tp: int) -> RolloutCluster:
    roofline = make_cost(request, tp)
    if request.measured_path is None:
        return RolloutCluster(roofline, roofline.cluster.num_replicas, roofline.kv_budget_tokens, roofline.describe())
    measured = TableCost.from_file(request.measured_path)
    table = measured.table
    if request.num_gpus % table.tp:
        raise CostModelError(f"{request.measured_path}: its TP {table.tp} does not divide --gpus {request.num_gpus}")
    kv_budget = table.kv_budget_tokens or make_cost(request, table.tp).kv_budget_tokens
    return RolloutCluster(measured, request.num_gpus // table.tp, kv_budget,
                          f"{measured.describe()}, {request.num_gpus // table.tp} replicas, KV budget {kv_budget:,}")


def to_cell(prompt_ratio: float, responses: int, run: SimRun, step_s: float, baseline_step_s: float | None) -> PlanCell:
    rounds = run.rounds
    return PlanCell(prompt_ratio, responses, mean(r.rollout_s for r in rounds), step_s,
                    (baseline_step_s or step_s) / step_s, mean(r.kind.value == "long" for r in rounds),
                    mean(r.wasted_tokens for r in rounds), mean(r.preemptions for r in rounds))


def simulate_cell(request: PlanRequest, lengths: LengthSource, tp: int, prompt_ratio: float, responses: int,
                  trainer: NonRolloutCost | None, baseline_step_s: float | None) -> PlanCell | SimRun:
    """One setting at one TP, in a worker process: its cell (with `trainer`), its run (without), or why not."""
    try:
        cluster = rollout_cluster(request, tp)
        enabled = (prompt_ratio, responses) != (1.0, request.responses_kept)
        policy = TailSettings(request.prompts_per_step, request.responses_kept, prompt_ratio, responses, enabled,
                              data_seed=request.seed, steps_per_poll=request.steps_per_poll)
        group = SimGroup.of(cluster.cost, lengths, cluster.num_replicas, NUM_SLOTS, cluster.kv_budget_tokens,
                            request.seed)
        streaming = request.streaming if trainer is not None else StreamingSettings()
        run = PolicySimulation(policy, lengths, group, trainer=trainer, streaming=streaming).run(request.rounds)
    except Infeasible as reason:
        return PlanCell(prompt_ratio, responses, infeasible=str(reason))
    return run if trainer is None else to_cell(prompt_ratio, responses, run, run.step_s, baseline_step_s)


def fan_out(jobs: int, calls: Sequence[tuple], on_done: Callable[[tuple, object], None]) -> None:
    """`simulate_cell(*args)` for every args, on `jobs` processes (in this one when 1); `on_done` as each ends."""
    if jobs <= 1 or len(calls) <= 1:
        for args in calls:
            on_done(args, simulate_cell(*args))
        return
    with ProcessPoolExecutor(min(jobs, len(calls)), mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(simulate_cell, *args): args for args in calls}
        for future in as_completed(futures):
            on_done(futures[future], future.result())


def tp_choice(tp: int, result: PlanCell | SimRun) -> TpChoice:
    if isinstance(result, PlanCell):
        return TpChoice(tp, infeasible=result.infeasible)
    short = [r for r in result.rounds if r.kind.value != "long"] or list(result.rounds)
    long = [r for r in result.rounds if r.kind.value == "long"] or short
    return TpChoice(tp, mean(r.rollout_s for r in short), mean(r.rollout_s for r in long),
                    mean(r.preemptions for r in short), mean(r.preemptions for r in long))


def choose_tp(request: PlanRequest, lengths: LengthSource, prompt_ratio: float, responses: int, jobs: int,
              progress: Callable[[str], None]) -> list[TpChoice]:
    """The setting at every TP that divides the GPUs (the measured file's only, with one): rollout only."""
    tps = [t for t in TP_CANDIDATES if request.num_gpus % t == 0]
    if request.measured_path is not None:
        tps = [TableCost.from_file(request.measured_path).table.tp]
    choices: dict[int, TpChoice] = {}

    def done(args: tuple, result) -> None:
        choice = choices[args[2]] = tp_choice(args[2], result)
        progress(f"TP {args[2]}: " + (choice.infeasible or
                                      f"short rounds {choice.short_round_s:.1f} s, long {choice.long_round_s:.1f} s"))

    fan_out(jobs, [(request, lengths, tp, prompt_ratio, responses, None, None) for tp in tps], done)
    return [choices[tp] for tp in tps]


def plan(request: PlanRequest, lengths: LengthSource, lengths_description: str,
         progress: Callable[[str], None] = lambda line: None) -> PlanResult:
    """Search the grid. A length source's draws depend only on (seed, round, request), so every setting sees
    the same responses for the same prompts."""
    jobs = request.jobs or os.cpu_count() or 1
    r0, settings = request.responses_kept, request.settings()
    baseline_run = simulate_cell(request, lengths, request.tp, 1.0, r0, None, None)
    if isinstance(baseline_run, PlanCell):  # not even the synchronous step fits: every cell says why
        progress(f"synchronous step at TP {request.tp}: {baseline_run.infeasible}")
        cells = [PlanCell(p, n, infeasible=baseline_run.infeasible) for p, n in settings]
        where = f"{request.model} on {request.num_gpus} x {request.hardware}, TP {request.tp}"
        return PlanResult(request, where, lengths_description, f"{request.pricing} (nothing ran to price)",
                          baseline_run, cells, None, choose_tp(request, lengths, 1.0, r0, jobs, progress))
    cluster = rollout_cluster(request, request.tp)
    table = cluster.cost.table if isinstance(cluster.cost, TableCost) else None
    trainer, pricing = step_pricing(request.pricing, make_cost(request, request.tp), baseline_run.rounds, table,
                                    request.shares)
    baseline = to_cell(1.0, r0, baseline_run, mean_step_time(baseline_run.rounds, trainer).total_s, None)
    progress(f"synchronous: rollout {baseline.rollout_s:.1f} s, step {baseline.step_s:.1f} s; the other settings "
             f"x >= {request.rounds} rounds on {jobs} processes")
    found: dict[tuple[float, int], PlanCell] = {(1.0, r0): baseline}
    todo = [key for key in dict.fromkeys(settings) if key not in found]  # the paper grid repeats some at small R0

    def done(args: tuple, cell: PlanCell) -> None:
        found[args[3], args[4]] = cell
        progress(f"[{len(found) - 1}/{len(todo)}] prompt ratio {args[3]:g}, {args[4]} responses: "
                 + (cell.infeasible or f"speedup {cell.speedup:.2f}x"))

    fan_out(jobs, [(request, lengths, request.tp, p, n, trainer, baseline.step_s) for p, n in todo], done)
    cells = [found[key] for key in settings]
    feasible = [c for c in cells if not c.infeasible]
    recommended = max(feasible, key=lambda c: c.speedup) if feasible else None
    best = recommended or baseline
    tp_choices = choose_tp(request, lengths, best.prompt_ratio, best.responses_launched, jobs, progress)
    return PlanResult(request, cluster.description, lengths_description, pricing, baseline, cells, recommended,
                      tp_choices)


def env_schedule_plan(request: PlanRequest, trajectories: Sequence[SimTrajectory], source: str) -> str:
    """`--env-trace`: P0 x R0 trajectories resampled from an agentic run's (`source` says from what) on this
    plan's rollout replicas and cost model, under each environment schedule (engines/sim/agentic.py): the table."""
    cluster = rollout_cluster(request, request.tp)
    rows = rows_per_replica(trajectories, cluster.kv_budget_tokens, NUM_SLOTS)
    num = request.prompts_per_step * request.responses_kept
    drawn = sample_trajectories(trajectories, num, request.seed)
    results = compare_schedules(drawn, cluster.cost, rows, cluster.num_replicas)
    header = [f"  P0={request.prompts_per_step} x R0={request.responses_kept}, resampled whole (seed {request.seed}) "
              f"from {source}", f"  {cluster.description}; {rows} rows a replica"]
    return schedule_table(results, header)
