"""Commit an iteration: checkpoint (when due), run state, metrics row."""
from __future__ import annotations

import tempfile
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState


@task(cache_policy=NO_CACHE)
def commit(ctx: RunContext, state: RunState, metrics_row: dict[str, Any], save_checkpoint: bool) -> RunState:
    """Files first, then the state that names them, then the metrics row.

    The checkpoint directory is a Hugging Face model directory (weights,
    config, tokenizer): `from_pretrained` loads it as it is.
    """
    if save_checkpoint:
        key = ctx.run_key("checkpoints", f"iter-{state.iteration - 1:04d}")  # the iteration just trained
        with tempfile.TemporaryDirectory() as staging:
            ctx.trainer.save_hf(staging)
            ctx.tokenizer.save_pretrained(staging)
            ctx.store.put_dir(key, staging)
        state = state.model_copy(update={"latest_checkpoint": key})
    ctx.store.write_text(ctx.run_key("state.json"), state.model_dump_json(indent=2))
    ctx.metrics.log(metrics_row)
    return state
