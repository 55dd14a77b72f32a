"""`tailflow replay RUN_ID --iteration K`: iteration K's optimizer step again, on the groups it trained on.

For debugging a step without the rollout that fed it: its loss, gradient norm, clip fraction and the rest, from
the dump the run wrote (`storage.dump_rounds`, engines/runs/round_dump.py) and the weights and optimizer the step
started from: the run's checkpoint after iteration K - 1 (the initial model, with a fresh optimizer, for K = 0).
The step runs on a trainer group like the run's (train.num_workers ranks, its backend) through the calls the train
task makes (`tasks/train.step_samples`, `start_policy_step`). When the run's checkpoint after K is still in the
store (storage.keep_last, keep_every), the replayed weights are compared with it: equal when the run trained as
it replays (not streamed: a streamed step sums its pieces in another order, within float rounding). With a
critic (train.advantage gae) the critic's checkpoint before K is loaded too and values the dumped round again,
so the replayed advantages are the run's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch
from transformers import AutoConfig

from tailflow.config import ConfigError
from tailflow.driver.inputs import resolve_model_path
from tailflow.driver.resume import read_critic_checkpoint
from tailflow.driver.workers import start_trainer_group
from tailflow.engines.cluster.runtime import start_ray
from tailflow.engines.cluster.trainer_group import TrainerGroup
from tailflow.engines.runs.checkpoint import read_checkpoint
from tailflow.engines.runs.layout import RunError, checkpoint_key, metrics_key, read_run_config, require_run
from tailflow.engines.runs.round_dump import read_round_dump
from tailflow.engines.store import ArtifactStore
from tailflow.engines.train.trainer import TrainStepStats
from tailflow.tasks.train import start_policy_step, step_samples


@dataclass(frozen=True)
class ReplayedStep:
    iteration: int
    started_from: str
    """The checkpoint the step started from (its store URI), or "the initial model"."""
    stats: TrainStepStats
    run_metrics: dict[str, float]
    """The run's own metrics row of the iteration, its `actor/*` and `critic/*` keys (empty: no row, e.g. it
    never committed)."""
    compared_with: str | None
    """The run's checkpoint after the iteration (its store URI); None: not kept."""
    max_weight_diff: float | None
    """Largest |replayed - run's| over every weight; None: nothing to compare with."""


def replay_step(store: ArtifactStore, run_id: str, iteration: int) -> ReplayedStep:
    require_run(store, run_id)
    config = read_run_config(store, run_id)
    dump = read_round_dump(store, run_id, iteration)  # first: a missing dump is the likeliest mistake
    before = checkpoint_key(run_id, iteration - 1) if iteration > 0 else None
    if before is not None and not store.has_dir(before):
        raise RunError(f"iteration {iteration} started from {store.uri(before)}, which is no longer in the store "
                       "(storage.keep_last / keep_every keep a run's checkpoints; replay an iteration whose "
                       "previous checkpoint was kept)")
    model_path = resolve_model_path(config, store)
    model_config = AutoConfig.from_pretrained(model_path)
    start_ray(config.cluster.address, config.cluster.num_cpus, config.train.num_ranks, config.cluster.num_gpus)
    groups: list[TrainerGroup] = []
    try:
        trainer = start_trainer_group(config, model_path)
        groups.append(trainer)
        critic = start_trainer_group(config, model_path, role="critic") if config.train.has_critic else None
        groups += [critic] if critic is not None else []
        if before is not None:
            directory = store.local_dir(before)
            trainer.load_checkpoint(read_checkpoint(directory, model_config))
            if critic is not None:
                critic.load_checkpoint(read_critic_checkpoint(directory, model_path))
        samples = step_samples(config, dump.groups, dump.weight_version, dump.max_staleness, critic)
        stats = start_policy_step(trainer, config, samples, critic).result()
        after = checkpoint_key(run_id, iteration)
        compared, diff = None, None
        if store.has_dir(after):
            run_weights = read_checkpoint(store.local_dir(after), model_config)["model"]
            compared, diff = store.uri(after), max_difference(trainer.state_dict(), run_weights)
    finally:
        for group in groups:
            group.shutdown()
    return ReplayedStep(iteration, store.uri(before) if before else "the initial model", stats,
                        run_metrics_of(store, run_id, iteration), compared, diff)


def max_difference(replayed: dict[str, torch.Tensor], run: dict[str, torch.Tensor]) -> float:
    if replayed.keys() != run.keys():
        raise ConfigError(f"the replayed model's weights are not the run checkpoint's: names differ "
                          f"({sorted(replayed.keys() ^ run.keys())[:3]} ...)")
    return max(float((replayed[name].float() - run[name].float()).abs().max()) for name in replayed)


def run_metrics_of(store: ArtifactStore, run_id: str, iteration: int) -> dict[str, float]:
    """The `actor/*` and `critic/*` values of the run's last metrics row for `iteration` (a row is appended again
    when an iteration is run again)."""
    try:
        lines = store.read_text(metrics_key(run_id)).splitlines()
    except FileNotFoundError:
        return {}
    rows = [row for row in map(json.loads, filter(None, lines)) if row.get("iteration") == iteration]
    return {key: value for key, value in rows[-1].items() if key.startswith(("actor/", "critic/"))} if rows else {}
