"""The paper half of bench/sim_validate.py: RollPacker's own settings on the `roofline` model.

The settings (arXiv 2509.21009, section 6): P0 = 128 prompts, R0 = 8, H800
GPUs; Qwen2.5-7B at an 8k cap on 16 GPUs (rollout TP 1), 14B at 16k on 32 (TP
2), 32B at 32k on 64 (TP 2). Tail batching is prompt ratio 1.25 with 10
responses launched for 8 kept. Paper numbers: Figure 11 (average rollout time
per period, seconds; the fixed-P and fixed-R rows are the other cells of that
figure) and Table 2 ("+ Tail Batching", end-to-end speedup over veRL).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean

from tailflow.engines.sim.efficiency import Efficiency
from tailflow.engines.sim.group import SimGroup
from tailflow.engines.sim.paper_lengths import PaperLikeLengths
from tailflow.engines.sim.roofline import RooflineCost
from tailflow.engines.sim.simulate import PolicySimulation, SimRound
from tailflow.engines.tail.state import TailSettings
from tailflow.engines.sim.step_time import mean_step_time, shares_from_baseline

P0, R0 = 128, 8
ETAS = (1.0, 1.125, 1.25, 1.5)
NUM_PROMPTS = 20_000
NUM_SLOTS = 2048
"""vLLM's max_num_seqs in RollPacker's example config: the KV budget, not slots, limits a replica."""


@dataclass(frozen=True)
class PaperSetting:
    name: str
    model: str
    num_gpus: int
    tp: int
    max_new_tokens: int
    sync_s: float
    """Figure 11, synchronous (eta 1.0)."""
    tail_s: float
    """Figure 11, 'Ours' (prompt ratio 1.25, 10 of 8 responses)."""
    e2e_speedup: float
    """Table 2, '+ Tail Batching'."""
    fixed_p: tuple[float, ...]
    """Figure 11, P = P0, responses ceil(eta x 8) for eta in ETAS."""
    fixed_r: tuple[float, ...]
    """Figure 11, R = R0, prompt ratio eta."""

    @property
    def rollout_ratio(self) -> float:
        return self.sync_s / self.tail_s


PAPER = (
    PaperSetting("7B/8k", "qwen2.5-7b", 16, 1, 8192, 82, 47, 1.30, (82, 77, 71, 54), (82, 77, 72, 60)),
    PaperSetting("14B/16k", "qwen2.5-14b", 32, 2, 16384, 277, 88, 1.48, (277, 260, 232, 115), (277, 244, 169, 143)),
    PaperSetting("32B/32k", "qwen2.5-32b", 64, 2, 32768, 673, 170, 2.21, (673, 658, 655, 265), (673, 636, 259, 279)),
)


@dataclass(frozen=True)
class SimulatedSetting:
    paper: PaperSetting
    sync: list[SimRound]
    tail: list[SimRound]
    e2e_speedup: float
    """With the paper's Table 1 stage shares fixed on the simulated synchronous step."""
    e2e_speedup_roofline: float
    """With first-principles train time (6N + 2 forward passes, MFU) and no reward."""

    @property
    def sync_s(self) -> float:
        return mean(r.rollout_s for r in self.sync)

    @property
    def tail_s(self) -> float:
        return mean(r.rollout_s for r in self.tail)

    @property
    def rollout_ratio(self) -> float:
        return self.sync_s / self.tail_s


def simulate_cell(setting: PaperSetting, prompt_ratio: float, responses: int, min_rounds: int, seed: int,
                  prompts_per_step: int = P0, efficiency: Efficiency = Efficiency()) -> list[SimRound]:
    """Prompt ratio 1 with R0 responses is the synchronous baseline (tail batching off: one batch call)."""
    enabled = (prompt_ratio, responses) != (1.0, R0)
    cost = RooflineCost.from_presets("h800", setting.model, setting.num_gpus, setting.tp, efficiency)
    lengths = PaperLikeLengths(NUM_PROMPTS, setting.max_new_tokens, seed)
    policy = TailSettings(prompts_per_step, R0, prompt_ratio, responses, enabled=enabled, data_seed=seed)
    group = SimGroup.of(cost, lengths, cost.cluster.num_replicas, NUM_SLOTS, cost.kv_budget_tokens)
    return PolicySimulation(policy, lengths, group).run_cycles(min_rounds)


def simulate_setting(setting: PaperSetting, min_rounds: int, seed: int, prompts_per_step: int = P0,
                     efficiency: Efficiency = Efficiency()) -> SimulatedSetting:
    sync = simulate_cell(setting, 1.0, R0, min_rounds, seed, prompts_per_step, efficiency)
    tail = simulate_cell(setting, 1.25, 10, min_rounds, seed, prompts_per_step, efficiency)
    return priced(setting, sync, tail, efficiency)


def priced(setting: PaperSetting, sync: list[SimRound], tail: list[SimRound],
           efficiency: Efficiency = Efficiency()) -> SimulatedSetting:
    """End to end: Table 1's shares fixed on the synchronous rounds, and the roofline's own trainer."""
    shares = shares_from_baseline(sync)
    roofline = RooflineCost.from_presets("h800", setting.model, setting.num_gpus, setting.tp, efficiency)
    return SimulatedSetting(setting, sync, tail,
                            mean_step_time(sync, shares).total_s / mean_step_time(tail, shares).total_s,
                            mean_step_time(sync, roofline).total_s / mean_step_time(tail, roofline).total_s)


def rel_err(simulated: float, paper: float) -> float:
    return abs(simulated - paper) / paper


def describe_rounds(rounds: list[SimRound]) -> str:
    short = [r.rollout_s for r in rounds if r.kind.value != "long"]
    long = [r.rollout_s for r in rounds if r.kind.value == "long"]
    text = f"{len(short)} short/sync rounds mean {mean(short):.1f} s"
    if long:
        text += f", {len(long)} long rounds mean {mean(long):.1f} s"
    return text + f", preemptions {sum(r.preemptions for r in rounds)}, idle {mean(r.replica_idle_ratio for r in rounds):.2f}"


def grid_row(setting: PaperSetting, fixed: str, min_rounds: int, seed: int) -> list[float]:
    """Figure 11's other cells: fixed P (responses ceil(eta R0)) or fixed R (prompt ratio eta)."""
    cells = []
    for eta in ETAS:
        ratio, responses = (1.0, math.ceil(eta * R0)) if fixed == "P" else (eta, R0)
        cells.append(mean(r.rollout_s for r in simulate_cell(setting, ratio, responses, min_rounds, seed)))
    return cells


def paper_short_round_bound(setting: PaperSetting, rounds_per_period: int = 5) -> float:
    """Upper bound on the paper's mean short round, from Figure 11 alone: a period of 4 short + 1 long round
    averages `tail_s`, and a long round (only the deferred, longest prompts) lasts at least a synchronous one."""
    return (rounds_per_period * setting.tail_s - setting.sync_s) / (rounds_per_period - 1)


def paper_implied_e2e(setting: PaperSetting, rollout_share: float = 0.72) -> float:
    """The end-to-end speedup the paper's own Figure 11 ratio gives with its Table 1 shares, if a tail-batched
    step paid the baseline's reward + train time: sync_step / (tail rollout + (1 - 0.72) sync_step)."""
    sync_step = setting.sync_s / rollout_share
    return sync_step / (setting.tail_s + (1 - rollout_share) * sync_step)
