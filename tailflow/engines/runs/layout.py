"""Where a run's files live in the artifact store (keys relative to the store root).

    <run>/config.yaml                 the resolved config the run was started (or last resumed) with
    <run>/metrics.jsonl               one row per iteration; rows past the committed iteration are dropped on resume
    <run>/checkpoints/iter-NNNN/      HF model dir + optimizer.pt, after iteration NNNN
    <run>/states/init.json            the state before iteration 0 (initial eval, no checkpoint)
    <run>/states/iter-NNNN.json       the state after iteration NNNN
    <run>/latest.json                 the commit pointer: names the newest committed state; written last
    <run>/rollout_trace.jsonl         one row per iteration: every launched response's length and outcome
    <run>/rounds/iter-NNNN.json       what iteration NNNN's step trained on (storage.dump_rounds)
    <run>/report.html, report/*.png   the run report (tailflow report); <run>/index.html lists the run's files
    .leases/<run>.json                the writer's lease (engines/runs/lease.py): outside <run>/, so a run
                                      refused before its first write leaves no directory behind
"""
from __future__ import annotations

from typing import Any

import yaml

from tailflow.config import ConfigError, RunConfig, config_from_dict


class RunError(ValueError):
    """A run that does not exist, or cannot do what was asked (nothing to resume, no checkpoint to export)."""


def checkpoint_key(run_id: str, iteration: int) -> str:
    return f"{run_id}/checkpoints/iter-{iteration:04d}"


def state_key(run_id: str, completed_iteration: int | None) -> str:
    """The state after `completed_iteration`; None: the initial state."""
    name = "init" if completed_iteration is None else f"iter-{completed_iteration:04d}"
    return f"{run_id}/states/{name}.json"


def latest_key(run_id: str) -> str:
    return f"{run_id}/latest.json"


def config_key(run_id: str) -> str:
    return f"{run_id}/config.yaml"


def saved_config(store: Any, run_id: str) -> RunConfig:
    """The config in `<run>/config.yaml` (a run with a commit has one)."""
    key = config_key(run_id)
    try:
        return config_from_dict(yaml.safe_load(store.read_text(key)) or {}, source=store.uri(key))
    except FileNotFoundError:
        raise ConfigError(f"run {run_id} has a commit but no {store.uri(key)}") from None


def require_run(store: Any, run_id: str) -> None:
    """Refuse a run id that is not a run directory name, or names no run in `store` (neither config nor commit)."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise RunError(f"run id {run_id!r} is not a run directory name")
    if not (store.exists(config_key(run_id)) or store.exists(latest_key(run_id))):
        raise RunError(f"run {run_id} does not exist in {store.uri()}")


def read_run_config(store: Any, run_id: str) -> RunConfig:
    """`saved_config`, with a config.yaml that is not YAML a ConfigError naming the file (for the commands that
    read a run: `tailflow runs`, a resume)."""
    try:
        return saved_config(store, run_id)
    except yaml.YAMLError as error:
        raise ConfigError(f"{store.uri(config_key(run_id))} is not valid YAML: {error}") from None


def metrics_key(run_id: str) -> str:
    return f"{run_id}/metrics.jsonl"


def rollout_trace_key(run_id: str) -> str:
    return f"{run_id}/rollout_trace.jsonl"


def round_dump_key(run_id: str, iteration: int) -> str:
    return f"{run_id}/rounds/iter-{iteration:04d}.json"


def lease_key(run_id: str) -> str:
    return f".leases/{run_id}.json"
