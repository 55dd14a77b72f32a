"""One iteration's metrics row, with ARCHITECTURE.md's names, built from its typed outcome."""
from __future__ import annotations

from typing import Any

from tailflow.engines.outcome import IterationOutcome
from tailflow.engines.tail.taken import OverlapStats, TakenRound
from tailflow.engines.track.env_metrics import env_metrics, model_token_count
from tailflow.engines.track.tail_bias import tail_bias
from tailflow.engines.train.samples import num_zero_signal_groups


def metrics_row(outcome: IterationOutcome, initial_eval_accuracy: float | None) -> dict[str, Any]:
    """`initial_eval_accuracy` goes into row 0 only (the run's starting point on the same plots)."""
    scored, taken = outcome.scored, outcome.taken
    responses = [response for group in scored.groups for response in group.responses]
    lengths = [model_token_count(response.completion) for response in responses]  # a trajectory's: the model's
    row: dict[str, Any] = {
        "iteration": outcome.iteration,
        "time/eval": outcome.evaluated.seconds if outcome.evaluated is not None else 0.0,
        "time/step_reward": scored.seconds,
        "time/step_train": outcome.trained.seconds,
        "time/step_model_update": outcome.synced.seconds,
        "time/step_total": outcome.step_seconds,
        **taken.stats.metrics(),
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
    row.update(tail_metrics(outcome))
    row.update(scored.stats.metrics())
    if outcome.reports_anchor:
        row["time/reward_timeout_anchor_s"] = outcome.anchors.task_s
    row["iteration/attempt"] = outcome.attempt
    if outcome.iteration == 0:
        row["eval/accuracy_initial"] = initial_eval_accuracy
    if outcome.is_async:
        row.update(async_metrics(taken, outcome.overlap, outcome.stopped_at_sync))
    if outcome.env_counters is not None:
        kept = [response.completion for response in responses]
        ended = {c.request_id: c for c in [*taken.aborted, *taken.finished]}  # one that finished as it was aborted
        row.update(env_metrics(kept, list(ended.values()), outcome.env_counters))
    return row


def tail_metrics(outcome: IterationOutcome) -> dict[str, Any]:
    """Tail batching's keys: the round, the queue, what aborts wasted (the kept prompts' responses beyond R0
    apart from the deferred prompts'), what was continued (tail.continue_deferred), and the length bias."""
    taken, plan, stats = outcome.taken, outcome.taken.planned.plan, outcome.scored.stats
    return {
        "tail/round": plan.round_metric,
        "tail/long_queue_size": len(outcome.tail.queue),
        "tail/aborted_requests": len(taken.result.aborted_request_ids),
        "tail/wasted_tokens": taken.result.wasted_tokens,
        "tail/wasted_tokens_completed": taken.result.wasted_completed_tokens,
        "tail/wasted_tokens_deferred": taken.result.wasted_tokens - taken.result.wasted_completed_tokens,
        "tail/continued_responses": len(taken.continued),
        "tail/continued_tokens": sum(taken.continued.values()),
        "tail/fresh_prompts": plan.fresh_prompts,
        **tail_bias(taken.result, stats.unused_reward_sum, stats.num_unused).metrics(),
    }


def async_metrics(taken: TakenRound, overlap: OverlapStats, stopped_at_sync: int) -> dict[str, Any]:
    """An asynchronous iteration's own metrics: how stale its batch was, and what the rollout did meanwhile.
    `async/staleness/<k>`: trained responses whose oldest token is k weight versions older than the weights
    that trained them (the histogram the iteration's artifact shows)."""
    responses = sum(taken.staleness.values())
    row: dict[str, Any] = {
        "async/staleness_mean": sum(lag * n for lag, n in taken.staleness.items()) / max(responses, 1),
        "async/staleness_max": max(taken.staleness, default=0),
        "async/mixed_version_responses": taken.mixed_version_responses,
        "async/rounds_ahead": taken.rounds_ahead,
        "async/prompts_in_flight": taken.prompts_in_flight,
        "async/requests_stopped_at_sync": stopped_at_sync,
        "async/engine_steps_during_train": overlap.engine_steps,
        "async/finished_during_train": overlap.finished,
        "async/tokens_during_train": overlap.tokens,
        "time/rollout_during_train": overlap.seconds,
    }
    row.update({f"async/staleness/{lag}": n for lag, n in taken.staleness.items()})
    return row
