"""Environment-level asynchrony and redundant environments against turn-synchronous rollout (issue 41).

    python bench/agentic.py [--iterations 10] [--seed 0] [--settings turn_sync,async,...] [--quick]
                            [--set KEY=VALUE ...]

Every setting runs configs/agentic.yaml (the tiny model on the built-in calculator, from its shipped warm start)
with the same seed, data and number of iterations, one after the other in this process, its environments slowed
by injected heavy-tailed latency (env.faults: each step sleeps a LogNormal draw, median 0.2 s, sigma 1.0, in the
environment's own process: mean 0.33 s, 5% of steps over 1 s, 1% over 2 s; a sandbox, a web page or a game server
answers in that range, and the rollout is then bound by its environments, as agentic rollouts on GPUs are). The
engine holds 512 sequences (rollout.num_slots) and the environment workers run 512 steps at once
(env.max_concurrent_steps): a trajectory waiting for its environment keeps its slot, so with fewer slots the
launched trajectories queue for slots and any extra ones cost their full time. Only these keys differ:

    turn_sync         env.schedule turn_sync: a barrier at every turn (the loop of a batch agent)
    async             env.schedule async: environment-level asynchrony (each trajectory waits for its own)
    faulty            async, plus 10% fail-slow environments (x20: median 4 s a step, past env.step_timeout_s's
                      10 s a timeout) and 5% fail-stop ones (SIGKILLed before one of their first 4 steps); no
                      redundancy (tail batching off: the round waits for every task)
    faulty+redundant  the same faults, with redundant rollout (REDUNDANCY): 50% more tasks than the step trains
                      (tail.prompt_ratio 1.5) and 4 trajectories per task beyond R0 (tail.responses_launched 12);
                      the first 32 complete groups are kept, the rest stopped and dropped (tail.defer false: a
                      long round would wait for the stragglers again), a failed environment never counts as
                      finished (engines/tail/completion.py)
    redundant         the same redundancy without faults: what the extra trajectories cost, or save, by
                      themselves, so that faulty+redundant / redundant is what the faults still cost with it
    lockstep          (only when named in --settings) env.schedule lockstep, tailflow's deterministic default:
                      each engine step waits for the environment calls of the step before; with 0.2 s steps that
                      is minutes an iteration here

Printed per setting: rollout seconds per iteration (time/step_generate), trajectories trained per second of
rollout, step seconds, environment failures, tokens stopped (tail/wasted_tokens), held-out accuracy at the end
(200 tasks, one greedy trajectory each: binomial standard error ~3.5 points at 50%, so two runs differ by
more than ~10 points only 5% of the time by chance); then what the redundant run's selection kept.

Targets (the issue): async >= 1.5x the trajectories per second of turn_sync; faulty+redundant's mean step within
1.2x of the fault-free async step; async's accuracy not below turn_sync's by more than the noise. Last line:
`RESULT env_async_speedup=<x> redundant_step_ratio=<y> unguarded_step_ratio=<z> accuracy_delta=<d>`.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import yaml
from common import REPO_DIR, chosen_names, config_tree

AGENTIC_CONFIG = REPO_DIR / "configs" / "agentic.yaml"

ASYNC_SPEEDUP_TARGET = 1.5
REDUNDANT_STEP_TARGET = 1.2
ACCURACY_NOISE_POINTS = 2 * 3.5
"""Two standard errors of one run's held-out accuracy over 200 tasks near 50%."""

LATENCY = {"env.faults.step_latency_median_s": 0.2, "env.faults.step_latency_sigma": 1.0,
           "env.max_concurrent_steps": 512, "rollout.num_slots": 512}
FAULTS = {"env.faults.fail_slow_fraction": 0.10, "env.faults.fail_slow_factor": 20.0,
          "env.faults.fail_stop_fraction": 0.05, "env.faults.fail_stop_within_steps": 4}
REDUNDANCY = {"env.schedule": "async", "tail.enabled": True, "tail.defer": False, "tail.prompt_ratio": 1.5,
              "tail.responses_launched": 12}
"""Redundant environment rollout: 50% more tasks and 4 more trajectories per task than a step trains, the first
complete groups kept, the rest dropped (not deferred: a long round would wait for the stragglers)."""
SETTINGS: dict[str, dict[str, Any]] = {
    "turn_sync": LATENCY | {"env.schedule": "turn_sync"},
    "lockstep": LATENCY | {"env.schedule": "lockstep"},
    "async": LATENCY | {"env.schedule": "async"},
    "faulty": LATENCY | FAULTS | {"env.schedule": "async"},
    "faulty+redundant": LATENCY | FAULTS | REDUNDANCY,
    "redundant": LATENCY | REDUNDANCY,
}


@dataclass(frozen=True)
class SettingResult:
    setting: str
    rows: list[dict[str, Any]]
    final_accuracy: float
    wall_s: float

    def mean(self, key: str) -> float:
        return mean(row[key] for row in self.rows)

    @property
    def trajectories_per_s(self) -> float:
        """Trajectories handed to the trainer per second of rollout."""
        kept = sum(sum(v for k, v in row.items() if k.startswith("env/stop/")) for row in self.rows)
        return kept / sum(row["time/step_generate"] for row in self.rows)


QUICK = {"data.prompts_per_step": 4, "rollout.n": 4, "data.num_eval": 8, "tail.responses_launched": 5,
         "env.faults.step_latency_median_s": 0.02}
"""--quick: 4 tasks x 4 trajectories (5 launched where redundant), 8 held-out tasks, 20 ms environment steps (at
0.2 s the smoke run sleeps ~3 min on turns a measurement needs and a smoke run does): the paths, not a
measurement."""


def run_setting(setting: str, iterations: int, seed: int, storage: Path, quick: bool = False,
                extra: dict[str, Any] | None = None) -> SettingResult:
    from tailflow.flows.training import rl_training

    overrides = SETTINGS[setting] | (extra or {}) | {"train.iterations": iterations, "train.eval_every": iterations,
                                     "data.seed": seed, "train.seed": seed, "storage.uri": str(storage)}
    if quick:
        overrides |= {key: value for key, value in QUICK.items()
                      if key != "tail.responses_launched" or "tail.responses_launched" in overrides}
    run_id = f"agentic-bench-{setting.replace('+', '-')}-{seed}"
    print(f"\n=== {setting} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
    started = time.perf_counter()
    summary = rl_training(config=config_tree(AGENTIC_CONFIG, overrides), run_id=run_id)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines() if line]
    print(f"=== {setting}: {wall:.0f} s, held-out {summary.final_accuracy:.3f} ===", flush=True)
    return SettingResult(setting, rows, summary.final_accuracy, wall)


def print_table(results: dict[str, SettingResult]) -> None:
    print(f"\n{'setting':17} {'rollout s/it':>13} {'traj/s':>8} {'step s':>8} {'env failures':>13} "
          f"{'stopped tokens':>15} {'dropped groups':>15} {'held-out %':>11}")
    for r in results.values():
        print(f"{r.setting:17} {r.mean('time/step_generate'):13.2f} {r.trajectories_per_s:8.1f} "
              f"{r.mean('time/step_total'):8.2f} {sum(row['env/failures'] for row in r.rows):13d} "
              f"{sum(row['tail/wasted_tokens'] for row in r.rows):15d} "
              f"{sum(row['env/groups_dropped'] for row in r.rows):15d} {100 * r.final_accuracy:11.1f}")


def print_selection(result: SettingResult) -> None:
    """What keeping the first complete groups selected, fault-free: the kept trajectories against every one that
    finished (kept or not) and every one launched (the stopped ones at the tokens they had), and the reward of the
    finished ones not kept against the kept ones'."""
    def over_rows(key: str) -> float:
        values = [row[key] for row in result.rows if key in row]
        return mean(values) if values else float("nan")

    print(f"selection ({result.setting}, fault-free): trajectory tokens kept {over_rows('tail/kept_length_mean'):.1f}"
          f", finished {over_rows('tail/completed_length_mean'):.1f}, launched (stopped ones so far) "
          f"{over_rows('tail/launched_length_mean'):.1f}; reward kept {over_rows('reward/mean'):.3f}, finished but "
          f"not kept {over_rows('tail/unkept_reward_mean'):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", default=",".join(name for name in SETTINGS if name != "lockstep"))
    parser.add_argument("--quick", action="store_true",
                        help="2 iterations of 4 tasks x 4 trajectories: a smoke run, not a measurement")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override on top of every setting's (a YAML value), for exploring")
    args = parser.parse_args()
    extra = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.set)}
    iterations = 2 if args.quick else args.iterations
    names = chosen_names(parser, args.settings, SETTINGS, "settings")
    with tempfile.TemporaryDirectory(prefix="agentic-bench-") as storage:
        results = {name: run_setting(name, iterations, args.seed, Path(storage), args.quick, extra) for name in names}
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps({name: {"rows": r.rows, "final_accuracy": r.final_accuracy,
                                               "wall_s": r.wall_s} for name, r in results.items()}))
    nan = float("nan")
    have = results.keys()
    speedup = (results["async"].trajectories_per_s / results["turn_sync"].trajectories_per_s
               if {"async", "turn_sync"} <= have else nan)
    base_step = results["async"].mean("time/step_total") if "async" in have else nan
    redundant = results["faulty+redundant"].mean("time/step_total") / base_step if "faulty+redundant" in have else nan
    unguarded = results["faulty"].mean("time/step_total") / base_step if "faulty" in have else nan
    delta = (100 * (results["async"].final_accuracy - results["turn_sync"].final_accuracy)
             if {"async", "turn_sync"} <= have else nan)
    guarded = (results["faulty+redundant"].mean("time/step_total") / results["redundant"].mean("time/step_total")
               if {"faulty+redundant", "redundant"} <= have else nan)
    print(f"\nwhat the faults cost with redundancy, against the same redundancy without faults: {guarded:.2f}x "
          f"(without redundancy, against no faults: {unguarded:.2f}x); redundancy alone costs "
          f"{results['redundant'].mean('time/step_total') / base_step if 'redundant' in have else nan:.2f}x "
          "the fault-free step here")
    if "redundant" in have:
        print_selection(results["redundant"])
    met = [speedup >= ASYNC_SPEEDUP_TARGET, redundant <= REDUNDANT_STEP_TARGET, delta >= -ACCURACY_NOISE_POINTS]
    print(f"\nverdict: async {speedup:.2f}x turn-synchronous trajectories/s (target >= {ASYNC_SPEEDUP_TARGET}); "
          f"faulty step {unguarded:.2f}x fault-free without redundancy, {redundant:.2f}x with it (target <= "
          f"{REDUNDANT_STEP_TARGET}); accuracy {delta:+.1f} points (noise {ACCURACY_NOISE_POINTS:.0f}): "
          f"{'all targets met' if all(met) else 'targets missed: ' + ', '.join(n for n, ok in zip(('speedup', 'redundancy', 'accuracy'), met) if not ok)}"
          f"{' (quick: a smoke run, not a measurement)' if args.quick else ''}")
    print(f"RESULT env_async_speedup={speedup:.3f} redundant_step_ratio={redundant:.3f} "
          f"unguarded_step_ratio={unguarded:.3f} accuracy_delta={delta:.2f}")


if __name__ == "__main__":
    main()
