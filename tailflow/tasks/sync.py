"""Weight sync: the trainer's full state dict reaches every rollout engine."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.run_context import RunContext


@task(cache_policy=NO_CACHE)
def sync_weights(ctx: RunContext, version: int) -> None:
    """Gather on trainer rank 0, one copy in Ray's object store, every engine loads it.

    Engines refuse new weights while a request is in flight, so no response
    ever mixes two versions.
    """
    ctx.rollout.load_weights(ctx.trainer.state_dict_ref(), version)
