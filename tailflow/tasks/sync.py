"""Weight sync: the trainer's full state dict reaches every rollout engine."""
from __future__ import annotations

import time

from tailflow.engines.cluster.placement import takes_turns
from tailflow.engines.cluster.weight_sync import push_weights
from tailflow.engines.outcome import WeightSync
from tailflow.engines.run_context import RunContext
from tailflow.tasks.cancellable import run_task


@run_task
def sync_weights(ctx: RunContext, version: int, iteration: int) -> WeightSync:
    """Engines refuse new weights while a request is in flight, so no response ever mixes two versions. Colocated
    on GPUs the trainer parks (and a critic offloads) first, so the engines wake into the GPU memory they held."""
    ctx.fault_point("sync", iteration)
    started = time.perf_counter()
    push_weights(ctx.trainer, ctx.rollout, version, take_turns=takes_turns(ctx.config), critic=ctx.critic)
    return WeightSync(version, time.perf_counter() - started)
