"""`tailflow plan`: which tail-batching settings to use on a cluster, and what they save, from a trace.

Every setting of the grid (prompt ratio x responses launched; the paper's
Figure 11 grid, or a finer one) runs the real policy on simulated replicas
for whole short+long cycles, from the same lengths and seed; the synchronous
baseline runs the same way. Per setting: rollout time per step (long rounds
amortised over their period), step time (rollout + reward + train + weight
sync), speedup over synchronous, how often a long round comes, wasted tokens.
Then the rollout TP for short and long rounds: the recommended setting again
at every TP that fits, keeping the best TP for each round kind (the paper
raises TP for long rounds when KV preemptions climb).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean
from typing import Callable, Sequence

from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.lengths import LengthSource
from tailflow.engines.sim.costs import CostModel, CostModelError
from tailflow.engines.sim.presets import hardware_preset, model_preset
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import SimRound, simulate_policy
from tailflow.engines.sim.step_time import (
    LinearStepCost, NonRolloutCost, StageShares, mean_step_time, shares_from_baseline)
from tailflow.engines.sim.table_cost import TableCost
from tailflow.engines.tail.planner import ceil_product
from tailflow.engines.tail.state import TailSettings

PAPER_FACTORS = (1.0, 1.125, 1.25, 1.5)
"""Figure 11: eta for the prompt ratio and for responses (ceil(eta x R0))."""
FINE_PROMPT_RATIOS = (1.0, 1.0625, 1.125, 1.1875, 1.25, 1.3125, 1.375, 1.4375, 1.5)
NUM_SLOTS = 2048
"""Slots per replica (vLLM's max_num_seqs in RollPacker's config): the KV budget is what limits a replica."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for: the cluster, the policy's fixed sizes, the search."""

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
    shares: StageShares | None = None
    """None: roofline train time and no reward; else reward and train fixed from the synchronous step's shares."""
    measured_path: str | None = None
    """A `measured` calibration file (docs/simulator.md): its step costs, TP and KV budget replace the roofline's
    for rollout (train time stays the roofline's unless the file has train_s_per_token); no TP search."""

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
    rollout_s: float
    """Mean rollout time per step over whole cycles."""
    step_s: float
    speedup: float
    """Synchronous step time / this step time."""
    long_round_share: float
    wasted_tokens: float
    """Per step."""
    preemptions: float
    """KV preemptions per step."""


@dataclass(frozen=True)
class TpChoice:
    tp: int
    short_round_s: float
    long_round_s: float
    preemptions_short: float
    preemptions_long: float


@dataclass(frozen=True)
class PlanReport:
    request: PlanRequest
    cost: str
    lengths: str
    baseline: PlanCell
    cells: list[PlanCell]
    recommended: PlanCell
    tp_choices: list[TpChoice]
    tp_short: int
    tp_long: int


def smallest_tp(hardware: str, model: str, num_gpus: int) -> int:
    """The smallest power-of-two TP (up to 8) whose replica holds the weights and one KV budget."""
    hardware_preset(hardware), model_preset(model)  # an unknown name is its own error, not "fits no TP"
    for tp in (1, 2, 4, 8):
        if num_gpus % tp == 0:
            try:
                RooflineCost.from_presets(hardware, model, num_gpus, tp).kv_budget_tokens
                return tp
            except ValueError:
                continue
    raise CostModelError(f"--model: {model} fits no TP <= 8 on {num_gpus} x {hardware}")


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


def step_cost_model(request: PlanRequest, cluster: RolloutCluster, sync: Sequence[SimRound]) -> NonRolloutCost:
    if request.shares:
        return shares_from_baseline(sync, request.shares)
    roofline = make_cost(request, request.tp)
    if isinstance(cluster.cost, TableCost) and cluster.cost.table.train_s_per_token:
        return LinearStepCost(cluster.cost.table.train_s_per_token, 0.0, roofline.weight_sync_s())
    return roofline


def simulate_setting(request: PlanRequest, lengths: LengthSource, cluster: RolloutCluster, prompt_ratio: float,
                     responses: int) -> list[SimRound]:
    enabled = (prompt_ratio, responses) != (1.0, request.responses_kept)
    policy = TailSettings(request.prompts_per_step, request.responses_kept, prompt_ratio, responses, enabled,
                          data_seed=request.seed, steps_per_poll=request.steps_per_poll)
    group = lambda: SimGroup.of(cluster.cost, lengths, cluster.num_replicas, NUM_SLOTS, cluster.kv_budget_tokens)
    return simulate_policy(policy, lengths, group, request.rounds)


def to_cell(prompt_ratio: float, responses: int, rounds: Sequence[SimRound], step_cost: NonRolloutCost,
            baseline_step_s: float | None) -> PlanCell:
    step = mean_step_time(rounds, step_cost).total_s
    return PlanCell(prompt_ratio, responses, mean(r.rollout_s for r in rounds), step,
                    (baseline_step_s or step) / step, mean(r.kind.value == "long" for r in rounds),
                    mean(r.wasted_tokens for r in rounds), mean(r.preemptions for r in rounds))


def choose_tp(request: PlanRequest, lengths: LengthSource, cell: PlanCell) -> list[TpChoice]:
    """The recommended setting at every TP (a power of two up to 8, one node) that fits the model."""
    choices = []
    for tp in (1, 2, 4, 8) if request.measured_path is None else (TableCost.from_file(request.measured_path).table.tp,):
        if request.num_gpus % tp:
            continue
        try:
            cluster = rollout_cluster(request, tp)
        except ValueError:
            continue  # weights do not fit at this TP
        rounds = simulate_setting(request, lengths, cluster, cell.prompt_ratio, cell.responses_launched)
        short = [r for r in rounds if r.kind.value != "long"] or rounds
        long = [r for r in rounds if r.kind.value == "long"] or short
        choices.append(TpChoice(tp, mean(r.rollout_s for r in short), mean(r.rollout_s for r in long),
                                mean(r.preemptions for r in short), mean(r.preemptions for r in long)))
    return choices


def plan(request: PlanRequest, lengths: LengthSource, lengths_description: str,
         progress: Callable[[str], None] = lambda line: None) -> PlanReport:
    """Search the grid. A length source's draws depend only on (seed, round, request), so every setting sees
    the same responses for the same prompts."""
    cluster = rollout_cluster(request, request.tp)
    sync = simulate_setting(request, lengths, cluster, 1.0, request.responses_kept)
    step_cost = step_cost_model(request, cluster, sync)
    baseline = to_cell(1.0, request.responses_kept, sync, step_cost, None)
    progress(f"synchronous: rollout {baseline.rollout_s:.1f} s, step {baseline.step_s:.1f} s")
    cells = []
    for prompt_ratio, responses in request.settings():
        if (prompt_ratio, responses) == (1.0, request.responses_kept):
            cells.append(baseline)
            continue
        rounds = simulate_setting(request, lengths, cluster, prompt_ratio, responses)
        cells.append(to_cell(prompt_ratio, responses, rounds, step_cost, baseline.step_s))
        progress(f"prompt ratio {prompt_ratio}, {responses} responses: speedup {cells[-1].speedup:.2f}x")
    recommended = max(cells, key=lambda c: c.speedup)
    tp_choices = choose_tp(request, lengths, recommended)
    return PlanReport(request, cluster.description, lengths_description, baseline, cells, recommended, tp_choices,
                      min(tp_choices, key=lambda t: t.short_round_s).tp, min(tp_choices, key=lambda t: t.long_round_s).tp)
