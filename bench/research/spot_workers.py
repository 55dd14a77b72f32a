"""Rollout throughput per number of workers, from the simulator's rollout model (for `spot.py`).

k workers of `gpus_per_worker` GPUs run the policy's rounds (the paper-like
lengths, the `roofline` model) on k x gpus_per_worker GPUs, exactly as the
synchronous simulator does (`research/async_settings.sync_rounds`); throughput is
tokens generated / rollout seconds over whole cycles. A fixed batch per step
finishes no sooner than its longest response, so throughput grows less than
linearly with workers, as FluidRL reports (12,000 -> 18,000 tokens/s, 1 -> 4).

Re-prefill after a preemption is priced as one replica prefilling a full KV
cache (its budget in tokens): an upper bound on what its in-flight prompts and
partial responses hold.
"""
from __future__ import annotations

from research.async_settings import AsyncSetting, rollout_cost, sync_rounds
from research.spot import WorkerModel


def simulated_workers(model: str, max_workers: int, *, hardware: str = "h100", gpus_per_worker: int = 8,
                      tp: int = 1, max_new_tokens: int = 8192, prompts_per_step: int = 128, tail: bool = False,
                      min_rounds: int = 10, seed: int = 0) -> WorkerModel:
    setting = AsyncSetting(f"{model}/{max_new_tokens}", model, gpus_per_worker * max_workers, tp, max_new_tokens,
                           hardware=hardware, prompts_per_step=prompts_per_step)
    throughput = {}
    for k in range(1, max_workers + 1):
        rounds = sync_rounds(setting, k * gpus_per_worker, tail, min_rounds, seed)
        throughput[k] = sum(r.tokens_generated for r in rounds) / sum(r.rollout_s for r in rounds)
    replica = rollout_cost(setting, tp)
    reprefill_s = replica.prefill_s(replica.kv_budget_tokens, 1)
    source = (f"simulated: {model} on {gpus_per_worker} x {hardware} per worker, TP {tp}, paper-like lengths at a "
              f"{max_new_tokens}-token cap, P0 = {prompts_per_step}, tail batching {'on' if tail else 'off'}")
    return WorkerModel(throughput, reprefill_s, source)


def reported_workers(points: dict[int, float], max_workers: int, source: str, reprefill_s: float = 0.0) -> WorkerModel:
    """A throughput table from reported figures, straight lines between the given worker counts."""
    known = sorted(points)
    if known[0] > 1 or known[-1] < max_workers:
        raise ValueError(f"reported throughput must cover 1..{max_workers} workers, got {known}")
    table = {}
    for k in range(1, max_workers + 1):
        low = max(n for n in known if n <= k)
        high = min(n for n in known if n >= k)
        share = 0.0 if high == low else (k - low) / (high - low)
        table[k] = points[low] + share * (points[high] - points[low])
    return WorkerModel(table, reprefill_s, source)
