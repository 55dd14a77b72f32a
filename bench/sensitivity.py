"""Rollout time per step over tail batching's two knobs: the paper's Figure 11 analogue.

    python bench/sensitivity.py [--prompts-per-step 32] [--min-steps 9] [--out bench/out/sensitivity.png] [--quick]

Rollout only (no Prefect, Ray or training, so the weights never change): one
in-process RolloutWorker with the warm-start model drives the real policy
through the product's rollout pipeline at alpha 0 (begin_round -> rule_for ->
the pipeline's take -> settle_round)
for every cell of prompt_ratio {1.0, 1.125, 1.25, 1.5} x responses_launched
{R0, 1.125 R0, 1.25 R0, 1.5 R0}, each cell from a fresh queue and data cursor
with the same seed, so every cell samples the same prompts' responses. Cells
run interleaved (step k of every cell, then step k+1), so a burst of load from
elsewhere on the machine hits all cells alike; each cell's CPU share is shown.
Engine decode steps are counted too: they do not depend on the machine, and a
memory-bound GPU step costs about the same at any batch size, so they show
what the grid would look like there.

Long rounds are amortised by running whole cycles: a cell runs at least
--min-steps steps and stops at the first step after which the long-prompt
queue is empty, so every prompt a short round deferred was paid for in its
long round; the figure is total rollout seconds / steps. Cell (1.0, R0) never
speculates (no prompt is deferred, every response is waited for): it is the
synchronous baseline, and speedups are against it.

The last line is `RESULT best_speedup=<x> prompt_ratio=<r> responses_launched=<n>`.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any, Sequence

from common import BENCH_DIR, MAX_NEW_TOKENS, ROLLOUT_THREADS, WARMSTART, default_config_tree
from rounds import RoundsInTurn

from tailflow.engines.rollout.requests import sampling_requests
from tailflow.engines.rollout.worker import LocalRollout
from tailflow.engines.tail import RoundKind, TailSettings, launched_prompts

PROMPT_RATIOS = (1.0, 1.125, 1.25, 1.5)
RESPONSE_FACTORS = (1.0, 1.125, 1.25, 1.5)
"""responses_launched = ceil(factor * R0)."""
DEFAULT_OUT = BENCH_DIR / "out" / "sensitivity.png"


@dataclass(frozen=True)
class Workload:
    """What every cell runs: the same worker, data, sampling and seed."""

    worker: Any
    """An in-process `RolloutWorker` (submit / poll / abort / generate / stats)."""
    tokenizer: Any
    train_problems: list
    problems_by_id: dict
    params: Any
    """SamplingParams of every request (temperature 1, max_new_tokens)."""
    prompts_per_step: int
    responses_kept: int
    steps_per_poll: int
    seed: int
    min_steps: int


@dataclass
class Cell:
    """One grid cell: its own tail state (long-prompt queue and data cursor), and what its rounds cost."""

    prompt_ratio: float
    responses_launched: int
    driver: Any = None
    """Its own `rounds.RoundsInTurn` (the product's pipeline: its queue and data cursor), from its first step."""
    round_seconds: list[float] = field(default_factory=list)
    round_cpu_seconds: list[float] = field(default_factory=list)
    """CPU time of this process (all its threads) per round: below threads x wall means a shared machine."""
    round_is_long: list[bool] = field(default_factory=list)
    tokens_generated: int = 0
    tokens_wasted: int = 0
    decode_steps: int = 0
    """Engine decode steps over all rounds: what a memory-bound GPU pays for (one step costs
    about the same at any batch size there), where this CPU pays per token."""

    @property
    def num_steps(self) -> int:
        return len(self.round_seconds)

    def is_done(self, min_steps: int) -> bool:
        """At least min_steps, and whole cycles: every deferred prompt has had its long round."""
        return self.num_steps >= min_steps and (len(self.driver.tail.queue) == 0 or self.num_steps >= 4 * min_steps)

    def run_step(self, w: Workload) -> None:
        """Plan, launch and drive this cell's next round on the product's pipeline; defer its stragglers."""
        if self.driver is None:
            settings = TailSettings(prompts_per_step=w.prompts_per_step, responses_kept=w.responses_kept,
                                    prompt_ratio=self.prompt_ratio, responses_launched=self.responses_launched,
                                    enabled=True, data_seed=w.seed, steps_per_poll=w.steps_per_poll)
            requests = lambda planned: sampling_requests(planned.problems, planned.plan.responses_per_prompt,
                                                         w.params, w.tokenizer, w.seed, planned.plan.iteration)
            self.driver = RoundsInTurn(LocalRollout(w.worker), settings, w.train_problems, requests)
        cpu_started = time.process_time()
        taken = self.driver.take()
        self.round_seconds.append(taken.stats.seconds)
        self.round_cpu_seconds.append(time.process_time() - cpu_started)
        self.round_is_long.append(taken.planned.plan.kind is RoundKind.LONG)
        self.tokens_generated += taken.stats.tokens_generated
        self.tokens_wasted += taken.result.wasted_tokens
        self.decode_steps += taken.stats.max_engine_steps

    @property
    def seconds_per_step(self) -> float:
        """Total rollout time / steps, over whole short+long cycles."""
        return sum(self.round_seconds) / self.num_steps

    @property
    def decode_steps_per_step(self) -> float:
        return self.decode_steps / self.num_steps

    @property
    def cpu_share(self) -> float:
        """CPU seconds / (wall seconds x torch threads): ~1 on an otherwise idle machine."""
        return sum(self.round_cpu_seconds) / (sum(self.round_seconds) * ROLLOUT_THREADS)

    @property
    def num_long(self) -> int:
        return sum(self.round_is_long)

    def mean_seconds(self, is_long: bool) -> float:
        chosen = [s for s, long in zip(self.round_seconds, self.round_is_long) if long == is_long]
        return mean(chosen) if chosen else float("nan")


def run_grid(w: Workload, cells: Sequence[Cell]) -> None:
    """Step k of every cell, then step k+1: a burst of load from elsewhere hits all cells alike.

    The weights never change, so interleaving changes no sampled token, only when each round runs.
    """
    started = time.perf_counter()
    step = 0
    while not all(cell.is_done(w.min_steps) for cell in cells):
        running = [cell for cell in cells if not cell.is_done(w.min_steps)]
        for cell in running:
            cell.run_step(w)
        print(f"step {step:2d}: {len(running)} cells, {sum(c.round_seconds[-1] for c in running):6.1f} s "
              f"[{time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}]", flush=True)
        step += 1


def build_workload(prompts_per_step: int | None, responses_kept: int | None, max_new_tokens: int, min_steps: int,
                   seed: int) -> Workload:
    from transformers import AutoTokenizer

    from tailflow.config import config_from_dict
    from tailflow.engines.data.arith import default_splits
    from tailflow.engines.rollout import RolloutWorker, SamplingParams

    overrides = {"rollout.max_new_tokens": max_new_tokens, "data.seed": seed, "train.seed": seed}
    if prompts_per_step:
        overrides["data.prompts_per_step"] = prompts_per_step
    if responses_kept:
        overrides["rollout.n"] = responses_kept
    config = config_from_dict(default_config_tree(overrides))
    train, _ = default_splits(config.data.num_train, config.data.num_eval, config.data.seed)
    tokenizer = AutoTokenizer.from_pretrained(WARMSTART)
    longest_prompt = max(len(ids) for ids in tokenizer([p.prompt for p in train], add_special_tokens=False)["input_ids"])
    worker = RolloutWorker(str(WARMSTART), config.rollout.num_slots, longest_prompt + max_new_tokens, seed,
                           ROLLOUT_THREADS)
    params = SamplingParams(temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                            top_k=config.rollout.top_k, max_new_tokens=max_new_tokens)
    return Workload(worker, tokenizer, train, {p.problem_id: p for p in train}, params,
                    config.data.prompts_per_step, config.rollout.n, config.tail.steps_per_poll, seed, min_steps)


def warm_up(w: Workload) -> None:
    """One tiny round first, so no cell pays torch's first-call costs."""
    from tailflow.engines.rollout import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    w.worker.generate(sampling_requests(w.train_problems[:4], 2, params, w.tokenizer, w.seed, -1))


def print_grid(title: str, cells: dict[tuple[float, int], Cell], ratios: Sequence[float], launched: Sequence[int],
               value, fmt: str) -> None:
    print(f"\n{title}")
    print("prompt_ratio \\ responses_launched" + "".join(f"{n:>10d}" for n in launched))
    for ratio in ratios:
        print(f"{ratio:<34.3f}" + "".join(fmt.format(value(cells[(ratio, n)])) for n in launched))


def print_tables(cells: dict[tuple[float, int], Cell], ratios: Sequence[float], launched: Sequence[int],
                 responses_kept: int) -> None:
    reference = cells[(1.0, responses_kept)]
    corner = f"(1.0, R0={responses_kept}), the no-speculation (synchronous) corner"
    print_grid("rollout seconds per step (long rounds amortised):", cells, ratios, launched,
               lambda c: c.seconds_per_step, "{:10.2f}")
    print_grid(f"speedup vs {corner}:", cells, ratios, launched,
               lambda c: reference.seconds_per_step / c.seconds_per_step, "{:9.2f}x")
    print_grid("engine decode steps per step (long rounds amortised; a flat-cost GPU step's time follows these):",
               cells, ratios, launched, lambda c: c.decode_steps_per_step, "{:10.0f}")
    print_grid(f"decode-step speedup vs {corner}:", cells, ratios, launched,
               lambda c: reference.decode_steps_per_step / c.decode_steps_per_step, "{:9.2f}x")
    print("\nper cell: steps (long rounds), mean short / long round seconds, tokens generated, wasted share, "
          f"CPU share of {ROLLOUT_THREADS} threads")
    for (ratio, n), cell in cells.items():
        print(f"  ({ratio:5.3f}, {n:2d}): {cell.num_steps:2d} steps ({cell.num_long} long), "
              f"short {cell.mean_seconds(False):6.2f} s, long {cell.mean_seconds(True):6.2f} s, "
              f"{cell.tokens_generated:8,d} tokens, {cell.tokens_wasted / max(cell.tokens_generated, 1):5.1%} wasted, "
              f"CPU {cell.cpu_share:4.0%}")
    cpu = sum(sum(c.round_cpu_seconds) for c in cells.values())
    wall = sum(sum(c.round_seconds) for c in cells.values())
    share = cpu / (wall * ROLLOUT_THREADS)
    shared = " (well below 100%: other work shared the cores, so the seconds are inflated)" if share < 0.85 else ""
    print(f"whole grid: {wall:.0f} s of rounds at {share:.0%} CPU share{shared}")


def draw_panel(ax, grid: list[list[float]], reference: float, unit: str, ratios: Sequence[float],
               launched: Sequence[int], responses_kept: int, title: str, fig) -> None:
    """One heatmap: `grid[i][j]` per (ratio i, launched j), lower is better, annotated with the speedup."""
    image = ax.imshow(grid, cmap="viridis_r", origin="lower", aspect="auto")
    low, high = min(map(min, grid)), max(map(max, grid))
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            is_light = (value - low) <= 0.5 * (high - low)  # viridis_r: the fastest cells are yellow
            ax.text(j, i, f"{value:.3g} {unit}\n{reference / value:.2f}x", ha="center", va="center", fontsize=8,
                    color="black" if is_light else "white", fontweight="bold")
    ax.set_xticks(range(len(launched)), [f"{n}\n({n / responses_kept:.3g} R0)" for n in launched])
    ax.set_yticks(range(len(ratios)), [f"{r:g}" for r in ratios])
    ax.set_xlabel("responses launched per prompt (short rounds)")
    ax.set_ylabel("prompt ratio (prompts launched / P0)")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=f"{unit} per step (lower is better)")


def write_heatmap(cells: dict[tuple[float, int], Cell], ratios: Sequence[float], launched: Sequence[int],
                  responses_kept: int, title: str, out: Path) -> None:
    """Left: measured seconds on this CPU. Right: engine decode steps, what a flat-cost GPU step pays."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = cells[(1.0, responses_kept)]
    seconds = [[cells[(ratio, n)].seconds_per_step for n in launched] for ratio in ratios]
    steps = [[cells[(ratio, n)].decode_steps_per_step for n in launched] for ratio in ratios]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    draw_panel(left, seconds, reference.seconds_per_step, "s", ratios, launched, responses_kept,
               "rollout seconds per step, measured on this CPU", fig)
    draw_panel(right, steps, reference.decode_steps_per_step, "steps", ratios, launched, responses_kept,
               "engine decode steps per step (flat-cost GPU proxy)", fig)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts-per-step", type=int, help="P0 (default: the default config's, 32; --quick: 4)")
    parser.add_argument("--min-steps", type=int,
                        help="steps per cell at least, then up to the queue emptying (default 9: one whole cycle at "
                             "every ratio, ~6 min here; 18: two at ratio 1.125, ~12 min; --quick: 3)")
    parser.add_argument("--max-new-tokens", type=int,
                        help=f"rollout.max_new_tokens (default {MAX_NEW_TOKENS}, as bench/tail_batching.py; --quick: 64)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="heatmap PNG")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: grid {1.0, 1.5} x {R0, 1.5 R0}, P0=4, R0=4, 64 new tokens, 3 steps per cell")
    args = parser.parse_args()

    ratios, factors = ((1.0, 1.5), (1.0, 1.5)) if args.quick else (PROMPT_RATIOS, RESPONSE_FACTORS)
    w = build_workload(args.prompts_per_step or (4 if args.quick else None), 4 if args.quick else None,
                       args.max_new_tokens or (64 if args.quick else MAX_NEW_TOKENS),
                       args.min_steps or (3 if args.quick else 9), args.seed)
    launched = [launched_prompts(w.responses_kept, factor) for factor in factors]
    print(f"workload: warm-start model, in-process RolloutWorker ({ROLLOUT_THREADS} torch threads, "
          f"{w.worker.stats().num_slots} slots), P0={w.prompts_per_step} R0={w.responses_kept} "
          f"max_new_tokens={w.params.max_new_tokens} temperature={w.params.temperature} "
          f"steps_per_poll={w.steps_per_poll} seed={w.seed}; each cell >= {w.min_steps} steps, whole cycles; "
          f"cells interleaved step by step")
    warm_up(w)
    cells = {(ratio, n): Cell(ratio, n) for ratio in ratios for n in launched}
    run_grid(w, list(cells.values()))
    print_tables(cells, ratios, launched, w.responses_kept)

    title = (f"Tail batching sensitivity (rollout only, long rounds amortised): P0={w.prompts_per_step}, "
             f"R0={w.responses_kept}, max_new_tokens={w.params.max_new_tokens}; annotation: value, speedup vs (1.0, R0)")
    write_heatmap(cells, ratios, launched, w.responses_kept, title, args.out)
    print(f"\nheatmap: {args.out}")

    reference = cells[(1.0, w.responses_kept)]
    (best_ratio, best_n), best = min(cells.items(), key=lambda item: item[1].seconds_per_step)
    best_speedup = reference.seconds_per_step / best.seconds_per_step
    (step_ratio, step_n), fewest = min(cells.items(), key=lambda item: item[1].decode_steps_per_step)
    default_key = (1.25, launched_prompts(w.responses_kept, 1.25))
    default_note = ""
    if default_key in cells:
        default = cells[default_key]
        default_note = (f"; the default {default_key} gives {reference.seconds_per_step / default.seconds_per_step:.2f}x "
                        f"in seconds, {reference.decode_steps_per_step / default.decode_steps_per_step:.2f}x "
                        "in decode steps")
    outcome = "speculation pays off" if best_speedup > 1.0 else "speculation does not pay off on this CPU"
    print(f"VERDICT: {outcome}: fastest cell ({best_ratio:g}, {best_n}) is {best_speedup:.2f}x the no-speculation "
          f"corner (1.0, {w.responses_kept}) in seconds; in decode steps (flat-cost GPU proxy) the best cell "
          f"({step_ratio:g}, {step_n}) is {reference.decode_steps_per_step / fewest.decode_steps_per_step:.2f}x"
          f"{default_note}")
    print(f"RESULT best_speedup={best_speedup:.2f} prompt_ratio={best_ratio:g} responses_launched={best_n}")


if __name__ == "__main__":
    main()
