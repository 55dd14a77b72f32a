"""Train step time of the two trainer backends, side by side: Megatron-core TP=2 against FSDP2 on 2 ranks.

    python bench/trainer.py [--quick] [--steps N] [--samples N]

Both trainers live in the same 2 gloo processes (megatron-core with its CPU
stand-in), start from the shipped warm-start model and take one optimizer
step each on the same batch, alternately (FSDP2, then Megatron, then the next
batch), so the machine's load hits both alike; a barrier starts every timed
step on both ranks together. The batch is a default-config-like step: groups
of 8 responses to arithmetic-length prompts, response lengths heavy-tailed
(most short, a few up to ~10x the median), train.loss decoupled_ppo (the
default config's, whose loss reads the model's log-probs), lr 2e-4.

Reported per step: each backend's seconds, their ratio, and how far apart
their loss and grad norm are (relative to FSDP2's). After every step Megatron
is given FSDP2's weights (untimed, `same_weights`), so each step compares the
two on the same weights; without that the two runs drift apart by float noise
as they step (tests/test_megatron_alignment.py bounds the drift over 3 steps). Megatron TP=2 splits every matmul
over the 2 processes while FSDP2 splits the batch; on this 2-core CPU with a
1.6M-parameter model neither has GPU-like compute, so the ratio says how
the two wrappers' overheads compare here, not what a GPU would show.

The last line is `RESULT megatron_vs_fsdp2_step=<megatron s / fsdp2 s, median>
max_loss_rel_diff=<x> max_gradnorm_rel_diff=<y>`.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
WARMSTART = REPO_DIR / "tailflow" / "assets" / "warmstart"
sys.path.insert(0, str(REPO_DIR / "tests"))  # the gloo-ranks launcher the Megatron tests use

from megatron_ranks import run_gloo_ranks  # noqa: E402

TRAINER_KWARGS = dict(lr=2e-4, max_grad_norm=1.0, loss="decoupled_ppo", max_tokens_per_micro_batch=8192)
BACKENDS = (("fsdp2", 1), ("megatron", 2))


def make_batch(num_samples: int, seed: int):
    """`num_samples` responses in groups of 8: prompts of 12-40 tokens, responses log-uniform over 8..300 tokens
    (median ~50), advantages +-1 within each group, rollout log-probs -3.0 sampled at temperature 1 (an
    importance-corrected loss refuses log-probs whose temperature it does not know)."""
    from tailflow.engines.train.batch import TrainSample

    rng = random.Random(seed)
    samples = []
    for group in range(num_samples // 8):
        prompt = tuple(rng.randrange(3, 22) for _ in range(rng.randint(12, 40)))
        for index in range(8):
            length = int(round(8 * (300 / 8) ** rng.random()))
            response = tuple(rng.randrange(3, 22) for _ in range(length))
            samples.append(TrainSample(prompt, response, 1.0 if index % 2 else -1.0, (-3.0,) * length,
                                       rollout_temperature=1.0))
    return samples


def timed_steps(rank: int, world_size: int, batches: list) -> dict[str, list[dict]]:
    """Per backend and batch: seconds, pg_loss, grad_norm (rank 0's view; every rank ends each step together)."""
    import torch.distributed as dist

    from tailflow.config import TrainConfig
    from tailflow.engines.train.batch import count_response_tokens, shard_across_ranks
    from tailflow.engines.train.trainer import PolicyTrainer

    trainers = {backend: PolicyTrainer(str(WARMSTART), TrainConfig(backend=backend, tensor_parallel=tensor_parallel,
                                                                   num_workers=world_size, **TRAINER_KWARGS),
                                       rank=rank, world_size=world_size)
                for backend, tensor_parallel in BACKENDS}
    results: dict[str, list[dict]] = {backend: [] for backend in trainers}
    for samples in batches:
        for backend, tensor_parallel in BACKENDS:
            mine = shard_across_ranks(samples, world_size // tensor_parallel)[rank // tensor_parallel]
            dist.barrier()
            started = time.perf_counter()
            stats = trainers[backend].train_step(mine, count_response_tokens(samples), len(samples))
            results[backend].append(dict(seconds=time.perf_counter() - started, pg_loss=stats.pg_loss,
                                         grad_norm=stats.grad_norm))
        same_weights(trainers["fsdp2"], trainers["megatron"])
    return results


def same_weights(source, target) -> None:
    """Give `target` the weights `source` has now (untimed), so every step compares the backends on the same
    weights: left alone the two trajectories drift apart, because Adam moves a weight by ~lr * sign(gradient)
    and the weights whose gradient is below float noise take either sign (tests/test_megatron_alignment.py
    measures the drift). Each keeps its own AdamW state."""
    import torch.distributed as dist

    full = [source.full_state_dict()]  # rank 0's; {} elsewhere
    dist.broadcast_object_list(full, src=0)
    target.load_checkpoint({"model": full[0], "optimizer": None, "shard": None})


def relative(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-12)


def report(results: dict[str, list[dict]], warmup: int) -> None:
    fsdp, megatron = results["fsdp2"], results["megatron"]
    print(f"{'step':>4} {'fsdp2 s':>9} {'megatron s':>11} {'ratio':>6} {'fsdp2 loss':>12} {'loss rel diff':>14} "
          f"{'fsdp2 gnorm':>12} {'gnorm rel diff':>15}")
    for step, (ref, got) in enumerate(zip(fsdp, megatron)):
        tag = " (warm-up)" if step < warmup else ""
        print(f"{step:>4} {ref['seconds']:>9.3f} {got['seconds']:>11.3f} {got['seconds'] / ref['seconds']:>6.2f} "
              f"{ref['pg_loss']:>12.6f} {relative(got['pg_loss'], ref['pg_loss']):>14.2e} "
              f"{ref['grad_norm']:>12.5f} {relative(got['grad_norm'], ref['grad_norm']):>15.2e}{tag}")
    fsdp_s = statistics.median(step["seconds"] for step in fsdp[warmup:])
    megatron_s = statistics.median(step["seconds"] for step in megatron[warmup:])
    loss_diff = max(relative(got["pg_loss"], ref["pg_loss"]) for ref, got in zip(fsdp, megatron))
    norm_diff = max(relative(got["grad_norm"], ref["grad_norm"]) for ref, got in zip(fsdp, megatron))
    print(f"median step (after {warmup} warm-up): fsdp2 {fsdp_s:.3f} s, megatron TP=2 {megatron_s:.3f} s, "
          f"megatron / fsdp2 = {megatron_s / fsdp_s:.2f}x")
    print(f"verdict: loss within {loss_diff:.1e} and grad norm within {norm_diff:.1e} relative over every step "
          f"(the alignment test's bound: 2e-4 each)")
    print(f"RESULT megatron_vs_fsdp2_step={megatron_s / fsdp_s:.2f} max_loss_rel_diff={loss_diff:.2e} "
          f"max_gradnorm_rel_diff={norm_diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 steps of 16 samples (a smoke run)")
    parser.add_argument("--steps", type=int, default=6, help="batches, the first one a warm-up")
    parser.add_argument("--samples", type=int, default=64, help="responses per batch (groups of 8)")
    args = parser.parse_args()
    steps, num_samples = (2, 16) if args.quick else (args.steps, args.samples)
    batches = [make_batch(num_samples, seed) for seed in range(steps)]
    tokens = sum(sample.num_tokens for sample in batches[0])
    print(f"bench/trainer.py: {steps} steps of {num_samples} samples (~{tokens} tokens each), 2 gloo ranks, "
          f"warm start {WARMSTART.name}, {TRAINER_KWARGS}")
    started = time.perf_counter()
    results = run_gloo_ranks(timed_steps, 2, batches)
    print(f"(both trainers built and run in {time.perf_counter() - started:.0f} s)")
    report(results, warmup=1)


if __name__ == "__main__":
    main()
