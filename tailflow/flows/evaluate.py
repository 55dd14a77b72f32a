"""Greedy held-out accuracy of a model directory, without training anything."""
from __future__ import annotations

from prefect import flow
from transformers import AutoTokenizer

from tailflow.config import load_config
from tailflow.engines.reward.scoring import score_groups
from tailflow.engines.store import open_store
from tailflow.engines.rollout.native import NativeEngine
from tailflow.engines.rollout.requests import greedy_requests, prompt_token_ids
from tailflow.flows.setup import load_datasets, resolve_model_path, reward_function


@flow(name="evaluate")
def evaluate_model(config_path: str | None = None, overrides: list[str] | None = None) -> float:
    config = load_config(config_path, overrides or [])
    model_path = resolve_model_path(config, open_store(config.storage.uri))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    problems = load_datasets(config, tokenizer, max_prompt_tokens=10**9).eval
    longest = max(len(prompt_token_ids(p, tokenizer, config.data.prompt_template)) for p in problems)
    engine = NativeEngine.from_pretrained(model_path, num_slots=config.rollout.num_slots,
                                          max_seq_len=longest + config.rollout.max_new_tokens, seed=config.train.seed)
    requests = greedy_requests(problems, config.rollout.max_new_tokens, tokenizer, config.data.prompt_template)
    groups = score_groups(problems, engine.generate(requests),
                          reward_function(config, model_path), tokenizer, config.reward.timeout_max_s)
    return sum(group.responses[0].correct for group in groups) / len(groups)
