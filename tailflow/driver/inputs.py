"""What a run reads before any actor starts: the model (model.path, or the warm start of the config's recipe), its
tokenizer and config, the reward spec, the datasets and the sampling settings.

Apart from the workers, so that preflight checks and `tailflow eval` load exactly what a run loads, without Ray.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from tailflow.config import ConfigError, RunConfig
from tailflow.engines.data.arith import ArithmeticTask, default_splits
from tailflow.engines.data.dataset import load_problems
from tailflow.engines.data.problem import Problem
from tailflow.engines.models import check_model_dir
from tailflow.engines.reward.spec import RewardSpec, reward_spec
from tailflow.engines.rollout.protocol import SamplingParams
from tailflow.engines.rollout.requests import prompt_token_ids
from tailflow.engines.store import ArtifactStore


def shipped_warmstart_dir() -> Path:
    """The warm-start checkpoint that ships with the package (see assets/warmstart/RECIPE.md)."""
    return Path(str(resources.files("tailflow") / "assets" / "warmstart"))


def recipe_of(config: RunConfig) -> dict:
    """Everything the warm-start weights depend on: a change to the task's generator is a new recipe."""
    return {**config.warmstart.model_dump(), "data_seed": config.data.seed, "num_train": config.data.num_train,
            "task": dataclasses.asdict(ArithmeticTask())}


def recipe_key(recipe: dict) -> str:
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"warmstart/{digest}"


def resolve_model_path(config: RunConfig, store: ArtifactStore) -> str:
    """model.path; else the warm start of the config's recipe: cached in the store, or shipped."""
    if config.model.path:
        path = Path(config.model.path)
    else:
        path = warm_start_dir(config, store)
    check_model_dir(path)
    return str(path)


def warm_start_dir(config: RunConfig, store: ArtifactStore) -> Path:
    recipe = recipe_of(config)
    if store.has_dir(recipe_key(recipe)):
        return store.local_dir(recipe_key(recipe))
    shipped = shipped_warmstart_dir()
    if json.loads((shipped / "recipe.json").read_text()) == recipe:
        return shipped
    raise ConfigError(f"no warm start for the warmstart.* settings of this config in {store.uri()}: "
                      "run `tailflow warmstart` with the same config first, or set model.path")


@dataclass(frozen=True)
class Datasets:
    train: list[Problem]
    eval: list[Problem]
    num_skipped: int


def load_datasets(config: RunConfig, tokenizer, max_prompt_tokens: int, runs_code: bool) -> Datasets:
    """`runs_code` (the reward spec's): code problems with tests (the built-in code task, or KodCode / APPS style
    files, `data.code_format`); else math-style problems with answers."""
    data = config.data
    if data.train_path is None:
        if config.env is not None:
            from tailflow.engines.data.env_task import env_splits

            train, held_out = env_splits(data.num_train, data.num_eval, data.seed)
        elif runs_code:
            from tailflow.engines.data.code_task import builtin_code_problems

            train, held_out = builtin_code_problems(data.seed)
        else:
            train, held_out = default_splits(data.num_train, data.num_eval, data.seed)
        return Datasets(train, held_out[: data.num_eval], 0)
    common = dict(id_field=data.id_field, prompt_template=data.prompt_template, tokenizer=tokenizer,
                  max_prompt_tokens=max_prompt_tokens, on_invalid=data.on_invalid)
    if runs_code:
        from tailflow.engines.data.code_task import load_code_problems

        load = functools.partial(load_code_problems, style=data.code_format, **common)
    else:
        load = functools.partial(load_problems, prompt_field=data.prompt_field, answer_field=data.answer_field,
                                 **common)
    train = load(data.train_path, source_name="data.train_path")
    held_out = load(data.eval_path, source_name="data.eval_path")
    return Datasets(train.problems, held_out.problems[: data.num_eval], train.num_skipped + held_out.num_skipped)


@dataclass(frozen=True)
class ModelInputs:
    """What a run, its preflight check and `tailflow eval` read before any actor starts."""
    model_path: str
    model_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    reward: RewardSpec
    datasets: Datasets
    """Prompts that fit the model's context with room for a response."""
    max_seq_len: int
    """The engines' sequence capacity: the longest prompt plus rollout.max_new_tokens (with `env`: the model's
    context, which a trajectory may fill)."""


def load_inputs(config: RunConfig, store: ArtifactStore) -> ModelInputs:
    """The model (`resolve_model_path`), its tokenizer, the reward spec and the datasets."""
    model_path = resolve_model_path(config, store)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    reward = reward_spec(config.reward, model_path)
    model_config = AutoConfig.from_pretrained(model_path)
    context_length = int(model_config.max_position_embeddings)
    max_prompt_tokens = context_length - config.rollout.max_new_tokens
    if max_prompt_tokens < 1:
        raise ConfigError(f"rollout.max_new_tokens ({config.rollout.max_new_tokens}) leaves no room for a prompt "
                          f"in the model's context of {context_length} tokens")
    datasets = load_datasets(config, tokenizer, max_prompt_tokens, reward.runs_code)
    longest_prompt = max(len(prompt_token_ids(p, tokenizer, config.data.prompt_template))
                         for p in datasets.train + datasets.eval)
    if config.env is not None:  # a trajectory may fill the context: observations' lengths are the environment's
        return ModelInputs(model_path, model_config, tokenizer, reward, datasets, context_length)
    return ModelInputs(model_path, model_config, tokenizer, reward, datasets,
                       longest_prompt + config.rollout.max_new_tokens)


def sampling_params(config: RunConfig) -> SamplingParams:
    """Training rollouts' sampling (each request's seed is derived per request)."""
    rollout = config.rollout
    return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                          max_new_tokens=rollout.max_new_tokens)
