"""The commit protocol: files first, then the state that names them, then `latest`, written last.

Why a crash anywhere leaves the previous commit whole, and how the store makes each write atomic:
docs/operations.md, What a commit is. A checkpoint or state `latest` does not name is garbage the next commit
overwrites or retention removes.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict

from tailflow.engines.run_state import RunState
from tailflow.engines.runs.layout import checkpoint_key, latest_key, state_key


class LatestPointer(BaseModel):
    """The content of `<run>/latest.json`."""

    model_config = ConfigDict(extra="forbid")

    iteration: int
    """Iterations completed (`RunState.iteration`)."""
    state: str
    """Store key of the committed state."""
    checkpoint: str | None
    """Store key of its checkpoint (None: the run's initial model)."""


class CommitError(RuntimeError):
    pass


def commit_state(store: Any, state: RunState, before_pointer: Callable[[], None] | None = None) -> LatestPointer:
    """Write the state, then point `latest` at it. Its checkpoint (if any) must already be stored.
    `before_pointer` runs between the two (the fault-injection tests crash there)."""
    completed = state.iteration - 1 if state.iteration > 0 else None
    key = state_key(state.run_id, completed)
    store.write_text(key, state.model_dump_json(indent=2))
    if before_pointer is not None:
        before_pointer()
    pointer = LatestPointer(iteration=state.iteration, state=key, checkpoint=state.latest_checkpoint)
    store.write_text(latest_key(state.run_id), pointer.model_dump_json(indent=2))
    return pointer


def read_latest(store: Any, run_id: str) -> LatestPointer | None:
    key = latest_key(run_id)
    if not store.exists(key):
        return None
    try:
        return LatestPointer.model_validate_json(store.read_text(key))
    except ValueError as error:
        raise CommitError(f"{store.uri(key)} is not a commit pointer: {error}") from error


def read_committed_state(store: Any, run_id: str) -> RunState | None:
    """The state `latest` names (None for a run that never committed), checked against its checkpoint."""
    pointer = read_latest(store, run_id)
    if pointer is None:
        return None
    try:
        state = RunState.model_validate_json(store.read_text(pointer.state))
    except (FileNotFoundError, ValueError) as error:
        raise CommitError(f"{store.uri(latest_key(run_id))} names {pointer.state}, which cannot be read: {error}") from error
    if state.iteration != pointer.iteration or state.latest_checkpoint != pointer.checkpoint:
        raise CommitError(f"{store.uri(pointer.state)} does not match {store.uri(latest_key(run_id))}")
    return state


CHECKPOINT_NAME = re.compile(r"iter-(\d{4,})")


def prune_checkpoints(store: Any, run_id: str, keep_last: int, keep_every: int, protected: str | None) -> list[str]:
    """Delete checkpoints beyond the newest `keep_last`, except multiples of `keep_every` (iteration + 1)
    and `protected` (the one `latest` names). Returns the deleted keys."""
    names = store.list_dir(f"{run_id}/checkpoints")
    iterations = sorted(int(m.group(1)) for name in names if (m := CHECKPOINT_NAME.fullmatch(name)))
    keep = set(iterations[-keep_last:]) if keep_last > 0 else set()
    deleted = []
    for iteration in iterations:
        key = checkpoint_key(run_id, iteration)
        if iteration in keep or key == protected or (keep_every > 0 and (iteration + 1) % keep_every == 0):
            continue
        store.delete_prefix(key)
        deleted.append(key)
    return deleted
