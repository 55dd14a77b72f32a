"""An asynchronous iteration's own metrics: how stale its batch was, and what the rollout did meanwhile."""
from __future__ import annotations

from typing import Any

from tailflow.engines.tail.pipeline import OverlapStats, TakenRound


def async_metrics(taken: TakenRound, overlap: OverlapStats, stopped_at_sync: int) -> dict[str, Any]:
    """`async/staleness/<k>`: trained responses whose oldest token is k weight versions older than the weights
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
