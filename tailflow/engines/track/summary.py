"""One iteration's metrics row, with ARCHITECTURE.md's names, built from its typed outcome."""
from __future__ import annotations

from typing import Any

from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.track.tail_bias import tail_bias
from tailflow.engines.train.samples import num_zero_signal_groups


def metrics_row(outcome: IterationOutcome, initial_eval_accuracy: float | None) -> dict[str, Any]:
    """`initial_eval_accuracy` goes into row 0 only (the run's starting point on the same plots)."""
    scored, rollout, plan = outcome.scored, outcome.rollout, outcome.planned.plan
    responses = [response for group in scored.groups for response in group.responses]
    lengths = [len(response.completion.token_ids) for response in responses]
    row: dict[str, Any] = {
        "iteration": outcome.iteration,
        "time/eval": outcome.evaluated.seconds if outcome.evaluated is not None else 0.0,
        "time/step_reward": scored.seconds,
        "time/step_train": outcome.trained.seconds,
        "time/step_model_update": outcome.synced.seconds,
        "time/step_total": outcome.step_seconds,
        **rollout.stats.metrics(),
        "token/response_length/mean": sum(lengths) / len(lengths),
        "token/response_length/max": max(lengths),
        "token/response_length/min": min(lengths),
        "reward/mean": sum(r.reward for r in responses) / len(responses),
        "reward/accuracy": sum(r.correct for r in responses) / len(responses),
        "reward/zero_signal_groups": num_zero_signal_groups(scored.groups),
        **outcome.trained.metrics(),
    }
    if outcome.evaluated is not None:
        row["eval/accuracy"] = outcome.evaluated.accuracy
    row.update({
        "tail/round": plan.round_metric,
        "tail/long_queue_size": len(outcome.tail.queue),
        "tail/aborted_requests": len(rollout.result.aborted_request_ids),
        "tail/wasted_tokens": rollout.result.wasted_tokens,
        "tail/fresh_prompts": plan.fresh_prompts,
        **tail_bias(rollout.result, scored.stats.unused_reward_sum, scored.stats.num_unused).metrics(),
    })
    row.update(scored.stats.metrics())
    if outcome.reports_anchor:
        row["time/reward_timeout_anchor_s"] = outcome.anchors.task_s
    row["iteration/attempt"] = outcome.attempt
    if outcome.iteration == 0:
        row["eval/accuracy_initial"] = initial_eval_accuracy
    return row
