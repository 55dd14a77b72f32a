"""A peer, side by side: TRL's GRPOTrainer and tailflow on the same work (issue 25, item 7).

    scripts/peer_env.sh [/work/venvs/trl]     # once: TRL 1.16 in a virtualenv of its own (never the default install)
    python bench/peer.py [--steps 20] [--trl-python /work/venvs/trl/bin/python] [--quick] [--tailflow-only]

Three runs, one after the other in this one invocation, each the same number of
optimizer steps from the shipped warm-start model on the embedded arithmetic
task, group size 8 x 32 prompts a step, 720 new tokens at most, temperature 1:

1. TRL 1.16's `GRPOTrainer` (transformers `generate()`, on CPU), as a subprocess
   in the TRL venv (bench/peer_trl.py), on the prompts tailflow's synchronous
   run draws, in the same order (`shuffle_dataset=False`), scored by
   tailflow's own math reward;
2. tailflow synchronous with tail batching off: the same algorithm (GRPO
   advantages, PPO clip with one optimizer step per batch, so ratio 1, the
   token-mean loss over the whole batch, no KL, same lr and clipping);
3. tailflow's default (configs/default.yaml: tail batching, asynchronous
   alpha 1, `decoupled_ppo`).

All three final checkpoints are scored by tailflow's greedy held-out
evaluation (engines/evaluation.py) on the same held-out problems (1000 by
default: one accuracy then has a standard error of ~1.5 points, a difference
of two ~2.1, about the 2-point target itself; one seed cannot resolve less):
the tailflow runs by their own final evaluation, TRL's saved model by
`tailflow eval`'s flow. Per step it prints each run's time and mean reward, then
`RESULT peer_step_speedup=<TRL step / tailflow sync step>
default_step_speedup=<TRL step / tailflow default step>
peer_accuracy_delta=<tailflow sync - TRL, points>
default_accuracy_delta=<tailflow default - TRL, points>` and a verdict
against the targets: sync >= 3x faster per step with accuracy within 2
points; the default faster still, accuracy not below TRL's.

Where TRL cannot match tailflow exactly, and why (also printed):
- Sampling: TRL draws with `generate()` from the torch global generator,
  tailflow from one seeded generator per request: the same distributions,
  different draws, so the runs diverge from the first step.
- Advantage: TRL divides by (std + 1e-4), tailflow by (std + 1e-6); both the
  unbiased group std. With 0/1 rewards (this task) the difference is at most
  1e-4 relative where std > 0, and both give equal-reward groups 0.
- Loss aggregation: TRL's `loss_type="dapo"` normalises by the response tokens
  of the whole accumulated batch, which is tailflow's `token_mean`. TRL computes
  it over 8 micro-batches of 4 prompts' responses (gradient accumulation, one
  optimizer step); tailflow over token-budget micro-batches on 2 FSDP2 ranks.
  tailflow skips the forward and backward of zero-advantage responses (the
  gradient is the same: they have none); TRL computes them.
- Optimizer: both torch AdamW (betas 0.9/0.999, eps 1e-8, no weight decay),
  constant lr (TRL's default linear decay is turned off), grad norm clipped at
  1.0, dropout off (tailflow trains in eval mode; TRL `disable_dropout`), fp32
  (TRL's bf16 default is turned off on CPU).
- Time per step: TRL's is wall time between optimizer steps (generation,
  reward, forward/backward, optimizer; it writes no checkpoint); tailflow's is
  `time/step_total` (rollout, reward, train, weight sync; the per-iteration
  commit of checkpoint and run state is not in it). Both runs' whole wall times
  are printed too.
- The default config trains other prompts: tail batching launches 1.25 x 32
  prompts a short round and defers the slowest to long rounds, so its batches
  are not TRL's.
- Threads: TRL runs in one process on torch's default threads; tailflow's
  rollout actor has 2, its two trainer ranks 1 each: both use this machine's
  2 cores.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any, Sequence

from common import DEFAULT_CONFIG, REPO_DIR, WARMSTART, default_config_tree

DEFAULT_TRL_PYTHON = "/work/venvs/trl/bin/python"
STEP_SPEEDUP_TARGET = 3.0
ACCURACY_TOLERANCE = 2.0
PROMPTS_PER_MICRO_BATCH = 4
"""TRL's micro-batch (per_device_train_batch_size) is this many prompts' responses; a step accumulates over the
rest (memory: a micro-batch of all 256 responses padded to 720 tokens would hold ~3.5 GB of attention scores)."""


@dataclass(frozen=True)
class PeerSettings:
    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    num_eval: int
    num_train: int
    seed: int


def settings_from_args(argv: Sequence[str] | None = None) -> tuple[PeerSettings, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="optimizer steps on every side (default 20; --quick: 2)")
    parser.add_argument("--trl-python", default=DEFAULT_TRL_PYTHON,
                        help=f"the TRL venv's python (scripts/peer_env.sh; default {DEFAULT_TRL_PYTHON})")
    parser.add_argument("--num-eval", type=int,
                        help="held-out problems scored greedily (default 1000: a standard error of ~1.5 points per "
                             "accuracy near 35%%, where 200 gives ~3.4; --quick: 16)")
    parser.add_argument("--seed", type=int, default=0, help="data.seed, train.seed and TRL's seed")
    parser.add_argument("--out", help="folder for the runs, TRL's model and timings (default: a temporary one)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 steps, 2 prompts x 4 responses, 48 new tokens, 16 eval problems")
    parser.add_argument("--tailflow-only", action="store_true",
                        help="run only the two tailflow runs (no TRL venv needed; no RESULT line)")
    args = parser.parse_args(argv)
    if args.quick:
        settings = PeerSettings(args.steps or 2, 2, 4, 48, args.num_eval or 16, 200, args.seed)
    else:
        settings = PeerSettings(args.steps or 20, 32, 8, 720, args.num_eval or 1000, 20000, args.seed)
    return settings, args


def common_overrides(settings: PeerSettings, storage: Path) -> dict[str, Any]:
    """Dotted keys both tailflow runs set on top of configs/default.yaml: the shared workload, initial and final
    evaluation only."""
    return {
        "model.path": str(WARMSTART), "data.num_train": settings.num_train, "data.num_eval": settings.num_eval,
        "data.prompts_per_step": settings.prompts_per_step, "data.seed": settings.seed,
        "rollout.n": settings.group_size, "rollout.max_new_tokens": settings.max_new_tokens,
        "train.iterations": settings.steps, "train.eval_every": settings.steps, "train.seed": settings.seed,
        "storage.uri": str(storage),
    }


def tailflow_trees(settings: PeerSettings, storage: Path) -> dict[str, dict[str, Any]]:
    """run id -> config tree: the synchronous run without tail batching (TRL's algorithm), and the default."""
    common = common_overrides(settings, storage)
    return {"peer-sync": default_config_tree(common | {"tail.enabled": False}, synchronous=True),
            "peer-default": default_config_tree(common, synchronous=False)}


def trl_config_kwargs(config, output_dir: str) -> dict[str, Any]:
    """`GRPOConfig` keyword arguments for the synchronous tailflow run's `config` (a RunConfig): its algorithm,
    batch, lr, clipping and sampling, with TRL's defaults that differ turned to tailflow's."""
    prompts, group, train = config.data.prompts_per_step, config.rollout.n, config.train
    prompts_per_micro = math.gcd(prompts, PROMPTS_PER_MICRO_BATCH)
    return dict(
        output_dir=output_dir, use_cpu=True, bf16=False, seed=config.train.seed, data_seed=config.data.seed,
        max_steps=train.iterations, num_train_epochs=1,
        per_device_train_batch_size=prompts_per_micro * group, gradient_accumulation_steps=prompts // prompts_per_micro,
        num_generations=group, shuffle_dataset=False, max_completion_length=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature, top_p=config.rollout.top_p, top_k=config.rollout.top_k,
        learning_rate=train.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=train.weight_decay,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch", max_grad_norm=train.max_grad_norm,
        beta=train.kl_coef, num_iterations=train.ppo_epochs, epsilon=train.clip_low, epsilon_high=train.clip_high,
        loss_type={"token_mean": "dapo", "constant": "dr_grpo"}[train.loss_agg],
        scale_rewards="group" if train.advantage == "grpo" else "none", mask_truncated_completions=False,
        disable_dropout=True, gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"},
        logging_steps=1, report_to="none", save_strategy="no", log_completions=False, disable_tqdm=True,
        dataloader_num_workers=0,
    )


def prompt_order(config) -> list:
    """The problems tailflow's synchronous run (tail batching off) trains, step by step in its order: P0 fresh
    prompts an iteration from the data cursor, over the datasets the run loads (problems that fit the model)."""
    from tailflow.engines.data.cursor import DataCursor, draw_prompts
    from tailflow.engines.store import open_store
    from tailflow.driver.inputs import load_inputs

    datasets = load_inputs(config, open_store(config.storage.uri)).datasets
    cursor, problems = DataCursor(), []
    for _ in range(config.train.iterations):
        problems += draw_prompts(datasets.train, cursor, config.data.prompts_per_step, config.data.seed)
    return problems


def trl_spec(config, problems: Sequence, folder: Path) -> dict[str, Any]:
    """What bench/peer_trl.py reads: its GRPOConfig, the model, the prompts in order (as tailflow formats them)
    with their answers, tailflow's math reward options, and where to write."""
    from tailflow.engines.reward.spec import reward_spec

    return {
        "config": trl_config_kwargs(config, str(folder / "trl-output")),
        "model_path": str(WARMSTART),
        "prompts": [config.data.prompt_template.format(prompt=p.prompt) for p in problems],
        "answers": [p.answer for p in problems],
        "reward": reward_spec(config.reward, str(WARMSTART)).options,
        "model_dir": str(folder / "trl-model"),
        "result_path": str(folder / "trl-result.json"),
    }


def run_trl(trl_python: str, spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    if not Path(trl_python).exists():
        raise SystemExit(f"--trl-python {trl_python} does not exist: make the TRL venv with scripts/peer_env.sh "
                         "(or pass --tailflow-only)")
    spec_path = folder / "trl-spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_DIR), os.environ.get("PYTHONPATH")])))
    print(f"\n=== TRL GRPOTrainer ({trl_python}), load average {os.getloadavg()[0]:.2f} ===", flush=True)
    subprocess.run([trl_python, str(Path(__file__).with_name("peer_trl.py")), str(spec_path)], check=True, env=env)
    return json.loads(Path(spec["result_path"]).read_text())


def evaluate_checkpoint(model_dir: str, config, storage: Path) -> float:
    """tailflow's greedy held-out accuracy of a model directory, on the runs' held-out problems."""
    from tailflow.flows.evaluate import evaluate_model

    overrides = [f"model.path={model_dir}", f"data.num_train={config.data.num_train}",
                 f"data.num_eval={config.data.num_eval}", f"data.seed={config.data.seed}",
                 f"rollout.max_new_tokens={config.rollout.max_new_tokens}", f"storage.uri={storage}"]
    return evaluate_model(str(DEFAULT_CONFIG), overrides)


@dataclass(frozen=True)
class Side:
    name: str
    step_seconds: list[float]
    step_rewards: list[float]
    accuracy: float
    wall_s: float
    initial_accuracy: float | None = None
    """The warm start's accuracy, evaluated by the run itself before its first step (tailflow runs)."""

    @property
    def mean_step(self) -> float:
        return mean(self.step_seconds)


def tailflow_side(name: str, tree: dict[str, Any], storage: Path, run_id: str) -> Side:
    from tail_batching import run_training

    run = run_training(name, tree, storage, run_id)
    return Side(name, [row["time/step_total"] for row in run.rows], [row["reward/mean"] for row in run.rows],
                run.final_accuracy, run.wall_seconds, run.initial_accuracy)


def trained_order_matches(storage: Path, run_id: str, problems: Sequence) -> bool:
    """Whether the run's rollout trace holds exactly `problems`' ids, round by round, in order."""
    from tailflow.engines.track.rollout_trace import RolloutTraceLog
    from tailflow.engines.store import LocalStore

    traced = [prompt.problem_id for round_ in RolloutTraceLog(LocalStore(storage), run_id).rounds()
              for prompt in round_.prompts]
    return traced == [problem.problem_id for problem in problems]


def print_steps(sides: Sequence[Side]) -> None:
    def line(label: str, cells: Sequence[str]) -> None:
        print(f"{label:28s}" + "".join(f"{cell:>26s}" for cell in cells))

    print("\nper step: seconds / mean reward of the step's trained responses")
    line("step", [side.name for side in sides])
    for step in range(max(len(side.step_seconds) for side in sides)):
        line(f"{step}", [f"{side.step_seconds[step]:.1f} s / {side.step_rewards[step]:.3f}"
                         if step < min(len(side.step_seconds), len(side.step_rewards)) else "-" for side in sides])
    line("mean", [f"{side.mean_step:.1f} s / {mean(side.step_rewards):.3f}" for side in sides])
    line("warm start's accuracy (%)", [f"{100 * side.initial_accuracy:.1f}" if side.initial_accuracy is not None
                                       else "(same model)" for side in sides])
    line("final held-out accuracy (%)", [f"{100 * side.accuracy:.1f}" for side in sides])
    line("run wall time (s)", [f"{side.wall_s:.0f}" for side in sides])
    print("(run wall time: TRL's training alone; a tailflow run's includes its setup and both evaluations)")


def verdict(peer: float, default: float, peer_delta: float, default_delta: float) -> str:
    checks = [
        (f"sync {peer:.2f}x per step", peer >= STEP_SPEEDUP_TARGET, f">= {STEP_SPEEDUP_TARGET:.0f}x"),
        (f"sync accuracy {peer_delta:+.1f} points", abs(peer_delta) <= ACCURACY_TOLERANCE,
         f"within {ACCURACY_TOLERANCE:.0f}"),
        (f"default {default:.2f}x per step", default > peer, "faster than sync"),
        (f"default accuracy {default_delta:+.1f} points", default_delta >= 0, "not below TRL"),
    ]
    parts = [f"{label} {'meets' if ok else 'MISSES'} {target}" for label, ok, target in checks]
    missed = sum(not ok for _, ok, _ in checks)
    return f"VERDICT: {'; '.join(parts)} -> " + ("all targets met" if not missed else f"{missed} of 4 missed")


def main(argv: Sequence[str] | None = None) -> None:
    settings, args = settings_from_args(argv)
    from tailflow.cli import quiet_prefect_defaults

    quiet_prefect_defaults()  # before prefect is imported
    from tailflow.config import config_from_dict

    with tempfile.TemporaryDirectory(prefix="peer-bench-") as scratch:
        folder = Path(args.out or scratch).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        storage = folder / "runs"
        trees = tailflow_trees(settings, storage)
        sync_config = config_from_dict(trees["peer-sync"])
        problems = prompt_order(sync_config)
        print(f"settings: {settings}; {len(problems)} training prompts in tailflow's synchronous order")
        sides = []
        if not args.tailflow_only:
            trl = run_trl(args.trl_python, trl_spec(sync_config, problems, folder), folder)
            accuracy = evaluate_checkpoint(str(folder / "trl-model"), sync_config, storage)
            sides.append(Side(f"TRL {trl['trl_version']}", trl["step_seconds"], trl["step_rewards"], accuracy,
                              trl["wall_s"]))
        names = {"peer-sync": "tailflow sync", "peer-default": "tailflow default"}
        sides += [tailflow_side(names[run_id], tree, storage, run_id) for run_id, tree in trees.items()]
        same_order = trained_order_matches(storage, "peer-sync", problems)
    print(f"prompt order: tailflow sync trained exactly the prompts handed to TRL, in order: "
          f"{'yes' if same_order else 'NO'}")
    print_steps(sides)
    print(f"machine: {os.cpu_count()} cores, load average now {os.getloadavg()[0]:.2f} (shared machines make "
          "absolute times noisy; the three runs ran one after the other)")
    if args.tailflow_only:
        print("TRL side skipped (--tailflow-only): no RESULT line")
        return
    trl_side, sync, default = sides
    peer, fast = trl_side.mean_step / sync.mean_step, trl_side.mean_step / default.mean_step
    peer_delta, default_delta = 100 * (sync.accuracy - trl_side.accuracy), 100 * (default.accuracy - trl_side.accuracy)
    print(verdict(peer, fast, peer_delta, default_delta))
    print(f"RESULT peer_step_speedup={peer:.2f} default_step_speedup={fast:.2f} "
          f"peer_accuracy_delta={peer_delta:.1f} default_accuracy_delta={default_delta:.1f}")


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"(bench/peer.py took {time.perf_counter() - started:.0f} s)", file=sys.stderr)
