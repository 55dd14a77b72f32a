"""One iteration's metrics row, with ARCHITECTURE.md's names."""
from __future__ import annotations

from typing import Any, Sequence

from tailflow.engines.reward.scoring import ScoredGroup
from tailflow.engines.rollout.rollout_stats import RolloutStats
from tailflow.engines.tail.completion import RoundResult
from tailflow.engines.tail.planner import RoundPlan
from tailflow.engines.tail.queue import LongPromptQueue
from tailflow.engines.train.samples import num_zero_signal_groups
from tailflow.engines.train.trainer import TrainStepStats


def iteration_metrics(
    iteration: int,
    groups: Sequence[ScoredGroup],
    rollout_stats: RolloutStats,
    train_stats: TrainStepStats,
    timings: dict[str, float],
    eval_accuracy: float | None,
) -> dict[str, Any]:
    responses = [response for group in groups for response in group.responses]
    lengths = [len(response.completion.token_ids) for response in responses]
    row: dict[str, Any] = {
        "iteration": iteration,
        **timings,
        **rollout_stats.metrics(),
        "token/response_length/mean": sum(lengths) / len(lengths),
        "token/response_length/max": max(lengths),
        "token/response_length/min": min(lengths),
        "reward/mean": sum(r.reward for r in responses) / len(responses),
        "reward/accuracy": sum(r.correct for r in responses) / len(responses),
        "reward/zero_signal_groups": num_zero_signal_groups(groups),
        **train_stats.metrics(),
    }
    if eval_accuracy is not None:
        row["eval/accuracy"] = eval_accuracy
    return row


def tail_metrics(plan: RoundPlan, queue: LongPromptQueue, result: RoundResult) -> dict[str, Any]:
    """The round's tail-batching figures; `queue` is the queue after this round's deferrals."""
    return {
        "tail/round": plan.round_metric,
        "tail/long_queue_size": len(queue),
        "tail/aborted_requests": len(result.aborted_request_ids),
        "tail/wasted_tokens": result.wasted_tokens,
        "tail/fresh_prompts": plan.fresh_prompts,
    }
