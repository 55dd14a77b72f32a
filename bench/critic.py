"""PPO with a critic (train.advantage gae) against GRPO, from the same warm start, on both built-in tasks (issue 43).

    python bench/critic.py [--iterations 50] [--seed 0] [--tasks default,agentic] [--advantages grpo,gae]
                           [--set KEY=VALUE ...] [--quick] [--out FILE]

Four runs in this process, one after the other, every one seeded alike: configs/default.yaml (the arithmetic
task, single-turn) and configs/agentic.yaml (the calculator environment, multi-turn), each with its own
`train.advantage` (grpo, as shipped) and with `train.advantage gae` (the critic: the policy's architecture with a
value head, its own ranks and AdamW; gamma 1, lambda 1, value clip 0.5, advantages whitened: the defaults).
Nothing else differs. Printed per run: held-out greedy accuracy before and after (200 problems each: a standard
error of ~3.5 points near 50%, so two runs differ by more than ~10 points only 5% of the time by chance), the
mean reward of the last 10 iterations, the mean step time and, for gae, the critic's explained variance over the
last 10 iterations. Last line: `RESULT default_gae_minus_grpo=<points> agentic_gae_minus_grpo=<points>
default_gae=<%> default_grpo=<%> agentic_gae=<%> agentic_grpo=<%>`.
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

TASKS = {"default": REPO_DIR / "configs" / "default.yaml", "agentic": REPO_DIR / "configs" / "agentic.yaml"}
ADVANTAGES = ("grpo", "gae")
NOISE_POINTS = 2 * 3.5
"""Two standard errors of one run's held-out accuracy over 200 problems near 50%."""
QUICK = {"data.prompts_per_step": 4, "rollout.n": 4, "data.num_eval": 8}


@dataclass(frozen=True)
class RunResult:
    task: str
    advantage: str
    rows: list[dict[str, Any]]
    initial_accuracy: float
    final_accuracy: float
    wall_s: float

    def last(self, key: str, count: int = 10) -> float:
        values = [row[key] for row in self.rows[-count:] if key in row]
        return mean(values) if values else float("nan")


def run(task: str, advantage: str, iterations: int, seed: int, storage: Path, quick: bool,
        extra: dict[str, Any]) -> RunResult:
    from tailflow.flows.training import rl_training

    overrides = {"train.advantage": advantage, "train.iterations": iterations, "train.eval_every": iterations,
                 "data.seed": seed, "train.seed": seed, "storage.uri": str(storage), "tracking.report_every": 0}
    if quick:
        overrides |= QUICK
    overrides |= extra
    run_id = f"critic-bench-{task}-{advantage}-{seed}"
    print(f"\n=== {task} / {advantage} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
    started = time.perf_counter()
    summary = rl_training(config=config_tree(TASKS[task], overrides), run_id=run_id)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines() if line]
    print(f"=== {task} / {advantage}: {wall:.0f} s, held-out {summary.initial_accuracy:.3f} -> "
          f"{summary.final_accuracy:.3f} ===", flush=True)
    return RunResult(task, advantage, rows, summary.initial_accuracy, summary.final_accuracy, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--quick", action="store_true", help="2 iterations of 4 x 4: a smoke run, not a measurement")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--advantages", default=",".join(ADVANTAGES))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override on top of every run's (a YAML value; grpo ignores train.critic.*)")
    args = parser.parse_args()
    extra = {key: yaml.safe_load(value) for key, _, value in (item.partition("=") for item in args.set)}
    iterations = 2 if args.quick else args.iterations
    tasks = chosen_names(parser, args.tasks, TASKS, "tasks")
    advantages = chosen_names(parser, args.advantages, ADVANTAGES, "advantages")
    with tempfile.TemporaryDirectory(prefix="critic-bench-") as storage:
        results = {(t, a): run(t, a, iterations, args.seed, Path(storage), args.quick, extra)
                   for t in tasks for a in advantages}
    print(f"\n{'task':8} {'advantage':9} {'held-out before %':>18} {'after %':>8} {'reward (last 10)':>17} "
          f"{'step s':>7} {'critic explained variance (last 10)':>36}")
    for r in results.values():
        print(f"{r.task:8} {r.advantage:9} {100 * r.initial_accuracy:18.1f} {100 * r.final_accuracy:8.1f} "
              f"{r.last('reward/mean'):17.3f} {mean(row['time/step_total'] for row in r.rows):7.2f} "
              f"{r.last('critic/values_explained_variance'):36.3f}")
    if args.out:
        args.out.write_text(json.dumps({f"{t}/{a}": {"rows": r.rows, "initial": r.initial_accuracy,
                                                      "final": r.final_accuracy, "wall_s": r.wall_s}
                                        for (t, a), r in results.items()}))
    nan = float("nan")

    def accuracy(task: str, advantage: str) -> float:
        return 100 * results[task, advantage].final_accuracy if (task, advantage) in results else nan

    deltas = {t: accuracy(t, "gae") - accuracy(t, "grpo") for t in TASKS}
    verdicts = [f"{t}: gae {accuracy(t, 'gae'):.1f}% vs grpo {accuracy(t, 'grpo'):.1f}% ({deltas[t]:+.1f} points, "
                f"{'within' if abs(deltas[t]) <= NOISE_POINTS else 'beyond'} the noise of {NOISE_POINTS:.0f})"
                for t in tasks if (t, "gae") in results and (t, "grpo") in results]
    print(f"\nverdict: {'; '.join(verdicts)}{' (quick: a smoke run, not a measurement)' if args.quick else ''}")
    print(f"RESULT default_gae_minus_grpo={deltas['default']:.1f} agentic_gae_minus_grpo={deltas['agentic']:.1f} "
          f"default_gae={accuracy('default', 'gae'):.1f} default_grpo={accuracy('default', 'grpo'):.1f} "
          f"agentic_gae={accuracy('agentic', 'gae'):.1f} agentic_grpo={accuracy('agentic', 'grpo'):.1f}")


if __name__ == "__main__":
    main()
