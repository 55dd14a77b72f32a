"""Asynchronous training, the stream trainer and skipping groups with no signal, against the synchronous step.

    python bench/async.py [--iterations 8] [--seeds 0,1,2] [--settings sync,tail,...] [--quick]

Every setting runs the default config (configs/default.yaml: the shipped warm-start model, the embedded
arithmetic task, P0=32 x R0=8, max_new_tokens 720) with the same seeds, data and number of optimizer steps;
only these keys differ:

    sync              tail.enabled false, train.skip_zero_advantage false      (the synchronous step)
    tail              tail batching, skip false                                 (the default before this issue)
    tail+skip         tail batching, skip true                                  (today's default)
    tail+skip+stream  tail batching, skip, train.stream true                    (the stream trainer)
    async1            tail off, skip false, rollout.async_ratio 1, decoupled_ppo
    async2            tail off, skip false, rollout.async_ratio 2, decoupled_ppo
    tail+async        tail batching, skip false, async_ratio 1, decoupled_ppo

Asynchronous runs need an importance-corrected loss; `decoupled_ppo` is the one that equals `ppo_clip` on
on-policy data (its proximal policy is the trainer's own, its importance weight 1).

Printed per setting (mean over seeds, spread = max - min): step time, generate / train time, how much
generation overlapped training, CPU use per phase, the staleness histogram, held-out accuracy at the end.

CPU per phase: a thread samples /proc every 0.25 s: the machine's busy share (/proc/stat) and the cores used
by the rollout actors and by the trainer ranks (each Ray actor's process title names its class). A sample is
"generate" when only the rollout actors work (> 0.3 core), "train" when only the trainers do, "both" when
both do (the overlap asynchronous training buys), else "other" (reward, commit, evaluation, start-up).

Targets (the issue): tail+skip+stream >= 1.3x the step time of the tail-batching default; every setting's
accuracy within 2 points of synchronous (mean over seeds). Last line:
`RESULT skip_stream_step_speedup=<x> async_step_speedup=<y> sim_async_speedup_32b=<z> accuracy_delta=<d>`.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from common import SYNCHRONOUS, WARMSTART, default_config_tree

SKIP_STREAM_TARGET = 1.3
ACCURACY_TOLERANCE = 2.0
ROLL_FLASH_REPORTED = 2.24
BUSY_CORES = 0.3
"""A group of actors counts as working in a sample when it used more than this many cores."""

ASYNC_LOSS = "decoupled_ppo"
ASYNC_STEP = {"train.loss": ASYNC_LOSS, "rollout.async_steps_per_train": 0, "tail.continue_deferred": False}
"""tail.continue_deferred (on in configs/default.yaml) off: this bench measures asynchrony against the synchronous
step alone; bench/tail_batching.py measures the continuing rule."""
SETTINGS: dict[str, dict[str, Any]] = {
    "sync": SYNCHRONOUS | {"tail.enabled": False, "train.skip_zero_advantage": False},
    "tail": SYNCHRONOUS | {"tail.enabled": True, "train.skip_zero_advantage": False},
    "tail+skip": SYNCHRONOUS | {"tail.enabled": True, "train.skip_zero_advantage": True},
    "tail+skip+stream": SYNCHRONOUS | {"tail.enabled": True, "train.skip_zero_advantage": True, "train.stream": True},
    "async1": ASYNC_STEP | {"tail.enabled": False, "train.skip_zero_advantage": False, "rollout.async_ratio": 1},
    "async2": ASYNC_STEP | {"tail.enabled": False, "train.skip_zero_advantage": False, "rollout.async_ratio": 2},
    "tail+async": ASYNC_STEP | {"tail.enabled": True, "train.skip_zero_advantage": False, "rollout.async_ratio": 1},
}


# ---- CPU sampling ------------------------------------------------------------------------------

def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def actor_jiffies() -> dict[int, tuple[str, int]]:
    """pid -> (group, CPU jiffies user + system) of every rollout actor and trainer rank, by process title."""
    found: dict[int, tuple[str, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            title = Path(entry.path, "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if not title.startswith("ray::"):
                continue
            group = "rollout" if "RolloutWorker" in title else "trainer" if "TrainerWorker" in title else None
            if group is None:
                continue
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            found[int(entry.name)] = (group, int(fields[11]) + int(fields[12]))
        except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
            continue
    return found


def cores_used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], seconds: float,
               hz: int) -> dict[str, float]:
    """Cores each group used between two samples, over the processes present in both (a process that has just
    started would otherwise count its whole past)."""
    used = {"rollout": 0.0, "trainer": 0.0}
    for pid, (group, jiffies) in after.items():
        if pid in before:
            used[group] += max(jiffies - before[pid][1], 0) / hz / seconds
    return used


@dataclass
class PhaseUse:
    samples: int = 0
    busy: float = 0.0
    rollout_cores: float = 0.0
    trainer_cores: float = 0.0


@dataclass
class CpuSampler:
    """Samples /proc every `interval` s in a thread; `phases` sums what each kind of sample saw."""

    interval: float = 0.25
    phases: dict[str, PhaseUse] = field(default_factory=lambda: {p: PhaseUse() for p in
                                                                 ("generate", "train", "both", "other")})

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        last_machine, last_actors, last_t = machine_jiffies(), actor_jiffies(), time.monotonic()
        while not self._stop.wait(self.interval):
            machine, actors, now = machine_jiffies(), actor_jiffies(), time.monotonic()
            seconds = now - last_t
            busy_share = (machine[0] - last_machine[0]) / max(machine[1] - last_machine[1], 1)
            used = cores_used(last_actors, actors, seconds, hz)
            rollout, trainer = used["rollout"], used["trainer"]
            phase = ("both" if rollout > BUSY_CORES and trainer > BUSY_CORES else "generate" if rollout > BUSY_CORES
                     else "train" if trainer > BUSY_CORES else "other")
            use = self.phases[phase]
            use.samples += 1
            use.busy += busy_share
            use.rollout_cores += rollout
            use.trainer_cores += trainer
            last_machine, last_actors, last_t = machine, actors, now

    def describe(self) -> str:
        total = sum(use.samples for use in self.phases.values()) or 1
        parts = []
        for name, use in self.phases.items():
            if use.samples:
                n = use.samples
                parts.append(f"{name} {100 * n / total:.0f}% of the time: machine {100 * use.busy / n:.0f}% busy, "
                             f"rollout {use.rollout_cores / n:.2f} cores, trainers {use.trainer_cores / n:.2f} cores")
        return "; ".join(parts)


# ---- runs --------------------------------------------------------------------------------------

@dataclass
class RunResult:
    setting: str
    seed: int
    rows: list[dict[str, Any]]
    final_accuracy: float
    wall_seconds: float
    cpu_text: str
    """`CpuSampler.describe()` of the run."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__))

    @classmethod
    def load(cls, path: Path) -> "RunResult":
        return cls(**json.loads(path.read_text()))

    def mean(self, key: str) -> float:
        values = [row[key] for row in self.rows if row.get(key) is not None]
        return mean(values) if values else 0.0

    def staleness(self) -> dict[int, int]:
        histogram: dict[int, int] = {}
        for row in self.rows:
            for name, count in row.items():
                if name.startswith("async/staleness/"):
                    lag = int(name.rsplit("/", 1)[1])
                    histogram[lag] = histogram.get(lag, 0) + count
        return dict(sorted(histogram.items()))


def run_training(setting: str, seed: int, overrides: dict[str, Any], storage: Path) -> RunResult:
    from tailflow.flows.training import rl_training

    tree = default_config_tree(overrides | SETTINGS[setting] | {"data.seed": seed, "train.seed": seed,
                                                                 "storage.uri": str(storage)})
    run_id = f"async-bench-{setting.replace('+', '-')}-{seed}"
    print(f"\n=== {setting}, seed {seed} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
    started = time.perf_counter()
    with CpuSampler() as cpu:
        summary = rl_training(config=tree, run_id=run_id)
    wall = time.perf_counter() - started
    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines() if line]
    print(f"=== {setting}, seed {seed}: {wall:.0f} s, accuracy {summary.final_accuracy:.3f} ===", flush=True)
    return RunResult(setting, seed, rows, summary.final_accuracy, wall, cpu.describe())


@dataclass(frozen=True)
class SettingSummary:
    setting: str
    step_s: float
    generate_s: float
    train_s: float
    overlap_s: float
    accuracy: float
    accuracy_spread: float
    skipped: float
    staleness: dict[int, int]
    cpu: str


def summarize(setting: str, runs: list[RunResult]) -> SettingSummary:
    accuracies = [run.final_accuracy * 100 for run in runs]
    staleness: dict[int, int] = {}
    for run in runs:
        for lag, n in run.staleness().items():
            staleness[lag] = staleness.get(lag, 0) + n
    return SettingSummary(
        setting, mean(r.mean("time/step_total") for r in runs), mean(r.mean("time/step_generate") for r in runs),
        mean(r.mean("time/step_train") for r in runs), mean(r.mean("time/rollout_during_train") for r in runs),
        mean(accuracies), max(accuracies) - min(accuracies), mean(r.mean("actor/skipped_samples") for r in runs),
        dict(sorted(staleness.items())), " | ".join(f"seed {r.seed}: {r.cpu_text}" for r in runs))


def print_table(summaries: dict[str, SettingSummary], baseline: str) -> None:
    base = summaries[baseline].step_s
    print(f"\n{'setting':18} {'step s':>8} {'vs ' + baseline:>10} {'generate s':>11} {'train s':>8} "
          f"{'rolled during train s':>22} {'skipped/step':>13} {'accuracy %':>11} {'spread':>7}  staleness")
    for s in summaries.values():
        print(f"{s.setting:18} {s.step_s:8.2f} {base / s.step_s:9.2f}x {s.generate_s:11.2f} {s.train_s:8.2f} "
              f"{s.overlap_s:22.2f} {s.skipped:13.1f} {s.accuracy:11.1f} {s.accuracy_spread:7.1f}  "
              f"{s.staleness or '-'}")
    print("\nCPU per phase (samples every 0.25 s; see the docstring):")
    for s in summaries.values():
        print(f"  {s.setting}: {s.cpu}")


def simulated_async_speedup_32b() -> float:
    """The simulator's prediction for the paper's 32B setting at alpha 2 on disaggregated pools, async alone
    (tail batching off, as ROLL-Flash measures it; bench/sim_async.py prints the other settings)."""
    from research.async_predict import predict_async

    return predict_async("32b", 2.0, tail=False).speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=8, help="optimizer steps per run (default 8)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated data.seed = train.seed values")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"which of {', '.join(SETTINGS)}")
    parser.add_argument("--eval-problems", type=int, default=200, help="data.num_eval (default 200, the default's)")
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="keep each run's result here as <setting>-<seed>.json and reuse those already there "
                             "(a long bench that stopped goes on where it was)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 iterations, P0=4, R0=4, 48 new tokens, 16 eval problems, one seed, "
                             "one trainer rank")
    args = parser.parse_args()

    from tailflow.cli import quiet_prefect_defaults

    quiet_prefect_defaults()
    overrides: dict[str, Any] = {"model.path": str(WARMSTART), "train.iterations": args.iterations,
                                 "train.eval_every": 1000, "data.num_eval": args.eval_problems}
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.quick:
        overrides |= {"train.iterations": 2, "data.prompts_per_step": 4, "rollout.n": 4, "data.num_eval": 16,
                      "rollout.max_new_tokens": 48, "rollout.num_slots": 32, "tail.prompt_ratio": 1.5,
                      "train.num_workers": 1}  # one trainer rank: a process start (~8 CPU-s) less per run
        seeds = seeds[:1]
    chosen = [s for s in args.settings.split(",") if s]
    unknown = [s for s in chosen if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    print(f"config: configs/default.yaml + {overrides}; seeds {seeds}; settings {chosen}")

    results: dict[str, list[RunResult]] = {setting: [] for setting in chosen}
    with tempfile.TemporaryDirectory(prefix="async-bench-") as directory:
        for seed in seeds:  # seed by seed, every setting in turn: a slow patch of the machine hits all of them
            for setting in chosen:
                saved = args.runs_dir / f"{setting}-{seed}.json" if args.runs_dir else None
                if saved is not None and saved.exists():
                    results[setting].append(RunResult.load(saved))
                    print(f"=== {setting}, seed {seed}: reused {saved} ===")
                    continue
                result = run_training(setting, seed, overrides, Path(directory))
                if saved is not None:
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    result.save(saved)
                results[setting].append(result)
    summaries = {setting: summarize(setting, runs) for setting, runs in results.items()}
    baseline = "tail" if "tail" in summaries else chosen[0]
    print_table(summaries, baseline)

    def ratio(slow: str, fast: str) -> float:
        if slow in summaries and fast in summaries:
            return summaries[slow].step_s / summaries[fast].step_s
        return float("nan")

    skip_stream = ratio("tail", "tail+skip+stream")
    async_pairs = {"sync/async1": ratio("sync", "async1"), "sync/async2": ratio("sync", "async2"),
                   "tail/tail+async": ratio("tail", "tail+async")}
    async_best = max((v for v in async_pairs.values() if v == v), default=float("nan"))
    sim_32b = simulated_async_speedup_32b()
    sync_accuracy = summaries["sync"].accuracy if "sync" in summaries else float("nan")
    deltas = {s.setting: s.accuracy - sync_accuracy for s in summaries.values() if s.setting != "sync"}
    accuracy_delta = max((abs(d) for d in deltas.values()), default=0.0)

    print(f"\nstep-time ratios (this CPU, measured): tail/(tail+skip+stream) {skip_stream:.2f}x; "
          + ", ".join(f"{k} {v:.2f}x" for k, v in async_pairs.items()))
    print(f"accuracy vs sync (points): " + ", ".join(f"{k} {v:+.1f}" for k, v in deltas.items()))
    print(f"SIMULATED, not measured: async alpha=2 on disaggregated GPU pools, qwen2.5-32b preset: {sim_32b:.2f}x "
          f"(ROLL-Flash reports up to {ROLL_FLASH_REPORTED}x)")
    met_speed = skip_stream >= SKIP_STREAM_TARGET
    met_accuracy = accuracy_delta <= ACCURACY_TOLERANCE
    print(f"verdict: tail+skip+stream {skip_stream:.2f}x vs target {SKIP_STREAM_TARGET}x: "
          f"{'met' if met_speed else 'NOT met'}; largest accuracy gap to sync {accuracy_delta:.1f} points vs "
          f"{ACCURACY_TOLERANCE}: {'met' if met_accuracy else 'NOT met'} ({len(seeds)} seeds, {args.iterations} steps)")
    print(f"RESULT skip_stream_step_speedup={skip_stream:.2f} async_step_speedup={async_best:.2f} "
          f"sim_async_speedup_32b={sim_32b:.2f} accuracy_delta={accuracy_delta:.1f}")


if __name__ == "__main__":
    main()
