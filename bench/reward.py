"""The reward scheduler, side by side: fixed vs adaptive timeout, batch vs streamed scoring.

    python bench/reward.py [--quick]

(a) Adaptive timeout. A code workload on the built-in code task: 95% of the
    responses are the reference solutions, 5% never finish (an endless
    loop). Both arms score the same responses on the same reward pool
    (4 workers); the fixed arm gives every test `timeout_max_s` (30 s,
    the paper's), the adaptive arm `min(max(2 s, 1.5 * anchor), 30 s)` with
    the task anchor a first pass over *other* problems' correct solutions
    left (as in a run, where the anchor comes from earlier responses, not
    from the ones being scored). Target: fixed / adaptive reward-phase time
    >= 1.5, and the adaptive arm's mean reward equal to the fixed arm's (a
    timeout that kills correct code must lose, however fast it is).

(b) Streamed scoring on a training step. The same short RL run twice through
    the normal flow (Prefect, Ray rollout, trainer and reward actors): code
    reward on the built-in task, a tiny random printable-ASCII Qwen2 as the
    policy (it writes random text, so most programs fail at once; every one
    still runs in the sandbox), tail batching on. Only `reward.streaming`
    differs. Hidden fraction = 1 - streamed time/step_reward / batch
    time/step_reward. Target >= 0.8.

The last line is `RESULT adaptive_timeout_speedup=<x> reward_hidden_fraction=<y>`.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ADAPTIVE_TARGET = 1.5
HIDDEN_TARGET = 0.8
HANG = "```python\nwhile True:\n    pass\n```"


def code_workloads(num_responses: int, hang_fraction: float, seed: int):
    """(anchor problems, scored pairs): two disjoint samples of the built-in task. The scored pairs are
    (problem, response text): reference solutions, and every 1/hang_fraction-th an endless loop."""
    from tailflow.engines.data.code_task import builtin_code_problems

    train, _ = builtin_code_problems(seed)
    rng = random.Random(seed)
    shuffled = rng.sample(train, len(train))
    half = len(shuffled) // 2
    anchor_problems, scored = shuffled[:min(half, num_responses)], shuffled[half:half + num_responses]
    scored = [scored[i % len(scored)] for i in range(num_responses)]
    every = round(1 / hang_fraction)
    pairs = [(p, HANG if i % every == every - 1 else f"```python\n{p.solution}\n```") for i, p in enumerate(scored)]
    return anchor_problems, pairs


def score_phase(pool, items):
    started = time.perf_counter()
    outcomes = pool.score_all(items)
    return time.perf_counter() - started, outcomes


def adaptive_timeout_arm(args) -> dict:
    from tailflow.engines.cluster.reward_pool import RewardPool
    from tailflow.engines.reward.spec import RewardSpec
    from tailflow.engines.reward.timeouts import TimeoutAnchors, TimeoutPolicy
    from tailflow.engines.reward.worker import ScoreItem

    anchor_problems, workload = code_workloads(args.responses, 0.05, args.seed)
    spec = RewardSpec("code", dict(all_or_nothing=False, backend="auto", memory_mb=1024, max_processes=32,
                                   timeout_max_s=args.timeout_max))
    policy = TimeoutPolicy(adaptive=True, scale=1.5, min_s=args.timeout_min, max_s=args.timeout_max, scope="task")
    pool = RewardPool(spec, min_workers=4, max_workers=4)
    try:
        # the anchor a run would have: one pass over earlier correct responses (other problems' references)
        warm = [ScoreItem(f"warm{i}", f"```python\n{p.solution}\n```", p, args.timeout_max)
                for i, p in enumerate(anchor_problems)]
        _, warm_outcomes = score_phase(pool, warm)
        anchors = policy.updated(TimeoutAnchors(), [(item.problem, o.result.correct, o.result.exec_s)
                                                    for item, o in zip(warm, warm_outcomes)])
        arms = {}
        for name, timeout_of in (("fixed", lambda p: args.timeout_max),
                                 ("adaptive", lambda p: policy.timeout_s(p, anchors))):
            items = [ScoreItem(f"{name}{i}", text, p, timeout_of(p)) for i, (p, text) in enumerate(workload)]
            seconds, outcomes = score_phase(pool, items)
            arms[name] = dict(seconds=seconds, timeouts=sum(o.result.timeouts for o in outcomes),
                              reward=statistics.mean(o.result.reward for o in outcomes),
                              timeout_s=statistics.mean(item.timeout_s for item in items))
    finally:
        pool.shutdown()
    num_correct = sum(o.result.correct for o in warm_outcomes)
    return dict(arms=arms, responses=len(workload), hangs=sum(text == HANG for _, text in workload),
                warm=len(warm), warm_correct=num_correct, anchor_s=anchors.task_s,
                adaptive_timeout_s=policy.timeout_s(workload[0][0], anchors))


def tiny_code_model(directory: Path) -> Path:
    from tailflow.engines.data.tokenizer import PRINTABLE_ASCII
    from tailflow.engines.models import write_random_tiny_model

    return write_random_tiny_model(directory / "tiny-code-model", PRINTABLE_ASCII)


def streaming_arm(args, storage: Path, model: Path, streaming: bool) -> list[dict]:
    from tailflow.flows.training import rl_training

    config = {
        "model": {"path": str(model)},
        "data": {"prompts_per_step": args.prompts, "num_eval": 8},
        "rollout": {"n": 4, "max_new_tokens": args.max_new_tokens, "num_slots": 64},
        "reward": {"type": "code", "streaming": streaming, "min_workers": 1, "max_workers": 4},
        "train": {"iterations": args.iterations, "eval_every": 1000, "num_workers": 2},
        "tail": {"enabled": True},
        "storage": {"uri": str(storage)},
    }
    run_id = "streamed" if streaming else "batch"
    rl_training(config=config, run_id=run_id)
    return [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--responses", type=int, default=100, help="(a) responses scored per arm")
    parser.add_argument("--timeout-max", type=float, default=30.0, help="(a) T_max, the fixed arm's timeout")
    parser.add_argument("--timeout-min", type=float, default=2.0, help="(a) T_min")
    parser.add_argument("--iterations", type=int, default=5, help="(b) RL iterations per run")
    parser.add_argument("--prompts", type=int, default=16, help="(b) P0")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="(b) rollout.max_new_tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 responses, T_max 2 s, 1 iteration")
    args = parser.parse_args()
    if args.quick:
        args.responses, args.timeout_max, args.timeout_min = 20, 2.0, 0.5
        args.iterations, args.prompts, args.max_new_tokens = 1, 4, 24

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tailflow.cli import quiet_prefect_defaults

    quiet_prefect_defaults()
    import ray

    from tailflow.engines.reward.sandbox import default_backend

    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    print(f"sandbox backend: {default_backend()}")

    a = adaptive_timeout_arm(args)
    fixed, adaptive = a["arms"]["fixed"], a["arms"]["adaptive"]
    speedup = fixed["seconds"] / adaptive["seconds"]
    print(f"\n(a) {a['responses']} responses ({a['hangs']} endless loops) on 4 reward workers; "
          f"anchor pass over {a['warm']} other problems: {a['warm_correct']} reference solutions correct, "
          f"task anchor {a['anchor_s']:.3f} s -> adaptive timeout {a['adaptive_timeout_s']:.2f} s")
    print(f"{'arm':<9} {'phase s':>8} {'mean timeout s':>15} {'timeouts':>9} {'mean reward':>12}")
    for name, arm in a["arms"].items():
        print(f"{name:<9} {arm['seconds']:>8.2f} {arm['timeout_s']:>15.2f} {arm['timeouts']:>9} {arm['reward']:>12.3f}")
    print(f"fixed / adaptive reward-phase time: {speedup:.2f}x")

    with tempfile.TemporaryDirectory(prefix="reward-bench-") as directory:
        storage = Path(directory)
        model = tiny_code_model(storage)
        runs = {streaming: streaming_arm(args, storage, model, streaming) for streaming in (False, True)}
    print(f"\n(b) {args.iterations} iterations each, P0={args.prompts}, R0=4, max_new_tokens={args.max_new_tokens}, "
          f"code reward, tail batching")
    print(f"{'iter':>4} | {'batch: gen s':>12} {'reward s':>9} {'busy s':>7} | "
          f"{'streamed: gen s':>15} {'reward s':>9} {'busy s':>7} {'overlap':>8} {'workers':>8}")
    for batch_row, stream_row in zip(runs[False], runs[True]):
        print(f"{batch_row['iteration']:>4} | {batch_row['time/step_generate']:>12.2f} "
              f"{batch_row['time/step_reward']:>9.2f} {batch_row['time/reward_busy']:>7.2f} | "
              f"{stream_row['time/step_generate']:>15.2f} {stream_row['time/step_reward']:>9.2f} "
              f"{stream_row['time/reward_busy']:>7.2f} {stream_row['time/reward_overlap_ratio']:>8.2f} "
              f"{stream_row['time/reward_workers']:>8}")
    batch_reward = sum(row["time/step_reward"] for row in runs[False])
    stream_reward = sum(row["time/step_reward"] for row in runs[True])
    hidden = 1 - stream_reward / batch_reward
    batch_step = sum(row["time/step_total"] for row in runs[False])
    stream_step = sum(row["time/step_total"] for row in runs[True])
    print(f"reward time per run: batch {batch_reward:.2f} s, streamed {stream_reward:.2f} s -> hidden {hidden:.1%}")
    print(f"step time per run: batch {batch_step:.2f} s, streamed {stream_step:.2f} s "
          f"({batch_step / stream_step:.2f}x)")
    same_reward = adaptive["reward"] == fixed["reward"]
    ok_a, ok_b = speedup >= ADAPTIVE_TARGET and same_reward, hidden >= HIDDEN_TARGET
    print(f"VERDICT: adaptive_timeout_speedup {speedup:.2f} {'meets' if ok_a else 'MISSES'} >= {ADAPTIVE_TARGET} "
          f"with equal mean reward (fixed {fixed['reward']:.3f}, adaptive {adaptive['reward']:.3f}); "
          f"reward_hidden_fraction {hidden:.2f} {'meets' if ok_b else 'MISSES'} >= {HIDDEN_TARGET}")
    print(f"RESULT adaptive_timeout_speedup={speedup:.2f} reward_hidden_fraction={hidden:.2f}")


if __name__ == "__main__":
    main()
