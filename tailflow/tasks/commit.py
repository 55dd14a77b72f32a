"""Commit an iteration: checkpoint, metrics row, state, `latest` (the protocol in engines/runs/commit.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RngState, RunState
from tailflow.engines.models import value_model_config
from tailflow.engines.runs.checkpoint import CRITIC_DIR, weights_sha256, write_checkpoint
from tailflow.engines.runs.commit import commit_state, prune_checkpoints
from tailflow.engines.runs.layout import checkpoint_key
from tailflow.tasks.cancellable import run_task


@run_task
def commit(ctx: RunContext, state: RunState, metrics_row: dict[str, Any]) -> RunState:
    """Every iteration: the checkpoint (model + optimizer, a Hugging Face directory; with a critic, the critic's
    beside it in `critic/`), then the metrics row,
    then the state naming both, then `latest`. A crash anywhere before `latest` leaves the previous commit."""
    completed = state.iteration - 1
    key = checkpoint_key(ctx.run_id, completed)
    with tempfile.TemporaryDirectory() as staging:
        write_checkpoint(staging, ctx.trainer.checkpoint(), ctx.model_config, ctx.tokenizer)
        if ctx.critic is not None:
            write_checkpoint(Path(staging) / CRITIC_DIR, ctx.critic.checkpoint(), value_model_config(ctx.model_path),
                             ctx.tokenizer)
        sha256 = weights_sha256(staging)
        ctx.store.put_dir(key, staging)
    ctx.fault_point("checkpoint", completed)
    ctx.metrics.append(metrics_row)
    state = state.committed(key, sha256, RngState.capture(ctx.config.train.seed))
    commit_state(ctx.store, state, before_pointer=lambda: ctx.fault_point("commit", completed))
    ctx.metrics.publish(metrics_row)
    storage = ctx.config.storage
    prune_checkpoints(ctx.store, ctx.run_id, storage.keep_last, storage.keep_every, protected=key)
    return state
