"""Greedy held-out accuracy of a model directory, without training anything (`tailflow eval`).

The same evaluation a run makes (engines/evaluation.py), on the same kind of
workers: one rollout group and the reward pool on Ray.
"""
from __future__ import annotations

from prefect import flow

from tailflow.config import load_config
from tailflow.driver.inputs import load_inputs
from tailflow.driver.workers import start_rollout_and_reward
from tailflow.engines.cluster.runtime import start_ray
from tailflow.engines.evaluation import held_out_accuracy
from tailflow.engines.store import open_store


@flow(name="evaluate", persist_result=False)
def evaluate_model(config_path: str | None = None, overrides: list[str] | None = None) -> float:
    config = load_config(config_path, overrides or [], overrides_origin="overrides")
    inputs = load_inputs(config, open_store(config.storage.uri))
    start_ray(config.cluster.address, config.cluster.num_cpus, config.rollout.num_workers, config.cluster.num_gpus)
    rollout, pool, _ = start_rollout_and_reward(config, inputs.model_path, inputs.max_seq_len)
    try:
        return held_out_accuracy(rollout, pool, inputs.tokenizer, inputs.datasets.eval, config, inputs.reward.runs_code)
    finally:
        rollout.shutdown()
        pool.shutdown()
