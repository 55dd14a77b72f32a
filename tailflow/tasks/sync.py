"""Weight sync: the trainer's full state dict reaches every rollout engine."""
from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.cluster.weight_sync import push_weights
from tailflow.engines.outcome import WeightSync
from tailflow.engines.run_context import RunContext


@task(cache_policy=NO_CACHE)
def sync_weights(ctx: RunContext, version: int, iteration: int) -> WeightSync:
    """Engines refuse new weights while a request is in flight, so no response ever mixes two versions."""
    ctx.fault_point("sync", iteration)
    started = time.perf_counter()
    push_weights(ctx.trainer, ctx.rollout, version)
    return WeightSync(version, time.perf_counter() - started)
