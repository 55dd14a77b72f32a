"""Starting a run, or picking it up at its last commit.

A run id that has a commit (`latest.json`) resumes: same config (a changed
key is refused unless named in `allow_change`), the committed state, the
committed checkpoint's weights and optimizer in every actor, metrics rows past
the commit dropped, the driver's RNG restored. A run id with no commit starts
from the beginning (a crash before the first commit lost nothing). An explicit
resume (`tailflow resume`, a flow run with `resume=True`) takes its config from
`resume_config`: the run's saved config unless one is given.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tailflow.config import (ConfigError, RunConfig, apply_override, config_from_dict, config_to_yaml, flow_run_config,
                             load_config, override_origins)
from tailflow.driver.run_log import say
from tailflow.engines.run_context import RunContext
from tailflow.engines.run_state import RunState
from tailflow.engines.models import value_model_config
from tailflow.engines.runs.checkpoint import CRITIC_DIR, read_checkpoint
from tailflow.engines.runs.commit import CommitError, commit_state, read_committed_state
from tailflow.engines.runs.layout import RunError, config_key, read_run_config, require_run, saved_config
from tailflow.engines.store import open_store
from tailflow.engines.track.rollout_trace import RolloutTraceLog


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_keys(saved: RunConfig, requested: RunConfig) -> list[str]:
    old, new = flatten(saved.model_dump(mode="json")), flatten(requested.model_dump(mode="json"))
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def resume_config(run_id: str, config_path: str | None, overrides: list[str], allow_change: list[str],
                  config: RunConfig | dict | None = None,
                  overrides_origin: str = "--set") -> tuple[RunConfig, list[str]]:
    """The config a resume (`tailflow resume`, a `resume=True` flow run) continues with, and the keys it may change
    from the run's saved config: `allow_change` plus storage.uri, which may always differ (the run was found in
    this store, so it lives here: a moved or copied run resumes where it is).

    The config is `config` whole when given (a flow's parameter, taken as it is), else `-c config_path` plus the
    overrides as given, else the run's saved config with the overrides on top; storage.uri is always the store
    the run was found in (that of `config_path` plus the overrides). Refuses (RunError) a run that does not exist
    or never committed: there is nothing to resume. `overrides_origin`: what an error calls the overrides
    (`--set` on the command line, `overrides` for a flow's parameter)."""
    allow_change = [*allow_change, "storage.uri"]
    if config is not None:
        return flow_run_config(None, [], config), allow_change
    given = load_config(config_path, overrides, overrides_origin)
    store = open_store(given.storage.uri)
    require_run(store, run_id)
    if read_committed_state(store, run_id) is None:
        raise RunError(f"run {run_id} has nothing to resume in {store.uri()}: it never committed an iteration; "
                       f"start it again with `tailflow train --run-id {run_id}`")
    if config_path is not None:
        tree = given.model_dump(mode="json")
    else:
        tree = read_run_config(store, run_id).model_dump(mode="json")
        for assignment in overrides:
            apply_override(tree, assignment, overrides_origin)
    tree["storage"]["uri"] = given.storage.uri
    resumed = config_from_dict(tree, source=config_path or store.uri(config_key(run_id)),
                               origins=override_origins(overrides, overrides_origin))
    return resumed, allow_change


def check_config_for_resume(store: Any, run_id: str, requested: RunConfig, allow_change: list[str],
                            committed: RunState | None = None) -> None:
    """Refuse a resume whose config differs from the run's, except in the keys the user named, or that cannot
    continue `committed` (checked before the changed config is saved)."""
    if committed is not None and committed.pipeline is not None and committed.pipeline.rounds \
            and requested.rollout.async_ratio == 0:
        raise ConfigError(f"run {run_id} was committed with {len(committed.pipeline.rounds)} rounds running ahead of "
                          f"training (asynchronous, rollout.async_ratio > 0); resuming it with rollout.async_ratio 0 "
                          f"would lose their prompts and responses: resume with rollout.async_ratio >= 1")
    changed = changed_keys(saved_config(store, run_id), requested)
    unexpected = [key for key in changed if key not in allow_change]
    if unexpected:
        raise ConfigError(f"run {run_id} was started with a different config: {', '.join(unexpected)} changed; "
                          f"resume with the run's own config (`tailflow resume {run_id}`) or name the keys with "
                          f"--allow-change {','.join(unexpected)}")
    if changed:
        store.write_text(config_key(run_id), config_to_yaml(requested))


def finished_state(store: Any, run_id: str, requested: RunConfig, allow_change: list[str]) -> RunState | None:
    """The committed state of run `run_id` if it has nothing left to do with `requested`: every one of its
    `train.iterations` committed and no config key changed but those allowed. Read before anything starts (no
    lease needed: a commit is never half written), so resuming a finished run costs two reads."""
    committed = read_committed_state(store, run_id)
    if committed is None or committed.iteration < requested.train.iterations:
        return None
    if any(key not in allow_change for key in changed_keys(saved_config(store, run_id), requested)):
        return None  # the run refuses this config with its own error, as any resume does
    say(f"[tailflow] run {run_id}: already finished ({committed.iteration} of {requested.train.iterations} "
        f"iterations committed, checkpoint {committed.latest_checkpoint or 'none'}); nothing to do")
    return committed


def commit_initial_state(ctx: RunContext, initial_eval_accuracy: float) -> RunState:
    state = RunState(run_id=ctx.run_id, initial_eval_accuracy=initial_eval_accuracy)
    commit_state(ctx.store, state)
    return state


def restore_weights(ctx: RunContext, state: RunState) -> None:
    """Put the committed checkpoint's weights and optimizer into every actor (fresh actors hold the initial
    model, which is what a state without a checkpoint means)."""
    if state.latest_checkpoint is not None:
        directory = ctx.store.local_dir(state.latest_checkpoint)
        checkpoint = read_checkpoint(directory, ctx.model_config)
        ctx.trainer.load_checkpoint(checkpoint)
        ctx.rollout.load_weights(checkpoint["model"], state.weight_version)
        if ctx.critic is not None:
            ctx.critic.load_checkpoint(read_critic_checkpoint(directory, ctx.model_path))


def read_critic_checkpoint(directory: Path, model_path: str) -> dict:
    """The critic's state inside a checkpoint `directory`; a CommitError naming it when the run had no critic
    when it wrote it (train.advantage changed to gae on resume)."""
    critic_dir = Path(directory) / CRITIC_DIR
    if not critic_dir.is_dir():
        raise CommitError(f"{directory} holds no {CRITIC_DIR}/ checkpoint: the run was not trained with "
                          "train.advantage gae when it wrote it, so there is no critic to resume")
    return read_checkpoint(critic_dir, value_model_config(model_path))


def restore_commit(ctx: RunContext, state: RunState) -> None:
    """Resume: the committed weights and optimizer, no metrics rows past the commit, the driver's RNG. (An
    asynchronous run's rounds in flight are restored by its next iteration, `tasks/rollout.take_round`.)"""
    restore_weights(ctx, state)
    if state.rng is not None:
        state.rng.restore()
    ctx.metrics.keep_committed(state.iteration)
    RolloutTraceLog(ctx.store, ctx.run_id).keep_committed(state.iteration)
