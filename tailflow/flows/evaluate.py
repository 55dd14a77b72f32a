"""Greedy held-out accuracy of a model directory, without training anything (`tailflow eval`).

The same evaluation a run makes (engines/evaluation.py), on the same kind of
workers: one rollout group and the reward pool on Ray.
"""
from __future__ import annotations

from prefect import flow
from transformers import AutoTokenizer

from tailflow.config import load_config
from tailflow.engines.cluster.runtime import start_ray
from tailflow.engines.evaluation import held_out_accuracy
from tailflow.engines.reward.spec import reward_spec
from tailflow.engines.store import open_store
from tailflow.flows.setup import load_for_model, resolve_model_path, start_rollout_and_reward


@flow(name="evaluate", persist_result=False)
def evaluate_model(config_path: str | None = None, overrides: list[str] | None = None) -> float:
    config = load_config(config_path, overrides or [], overrides_origin="overrides")
    model_path = resolve_model_path(config, open_store(config.storage.uri))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    reward = reward_spec(config.reward, model_path)
    datasets, max_seq_len = load_for_model(config, model_path, tokenizer, reward.runs_code)
    start_ray(config.cluster.address, config.cluster.num_cpus, config.rollout.num_workers, config.cluster.num_gpus)
    rollout, pool, _ = start_rollout_and_reward(config, model_path, max_seq_len)
    try:
        return held_out_accuracy(rollout, pool, tokenizer, datasets.eval, config, reward.runs_code)
    finally:
        rollout.shutdown()
        pool.shutdown()
