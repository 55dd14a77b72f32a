"""Warm start: SFT the embedded tiny model until GRPO has signal.

The result is cached in the artifact store under a key derived from the
recipe (SFT settings + data seed), so every later run with the same recipe
reuses it. The package ships the checkpoint this flow produced with the
default recipe (tailflow/assets/warmstart/), since it takes ~15 minutes on
two CPU cores; `tailflow warmstart` regenerates it.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from tailflow.config import RunConfig, load_config
from tailflow.driver.inputs import recipe_key, recipe_of
from tailflow.engines.data.arith import default_splits
from tailflow.engines.data.tokenizer import build_char_tokenizer
from tailflow.engines.models import build_tiny_model
from tailflow.engines.store import open_store
from tailflow.engines.train.sft import SFTConfig, sft_train


@task(cache_policy=NO_CACHE, persist_result=False)
def train_warm_start(config: RunConfig, output_dir: str) -> None:
    import torch

    torch.set_num_threads(1)  # measured fastest for this model on 2 shared cores
    tokenizer = build_char_tokenizer()
    train, _ = default_splits(config.data.num_train, config.data.num_eval, config.data.seed)
    model = build_tiny_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, config.warmstart.seed)
    settings = config.warmstart
    sft_train(model, tokenizer, train, SFTConfig(steps=settings.steps, batch_size=settings.batch_size,
                                                 lr=settings.lr, seed=settings.seed))  # defaults: warmstart.*
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


@flow(name="warm_start", persist_result=False)
def warm_start(config_path: str | None = None, overrides: list[str] | None = None) -> str:
    """Return the artifact-store path of the warm-start checkpoint, training it if not cached."""
    config = load_config(config_path, overrides or [], overrides_origin="overrides")
    store = open_store(config.storage.uri)
    recipe = recipe_of(config)
    key = recipe_key(recipe)
    if store.has_dir(key):
        return store.uri(key)
    with tempfile.TemporaryDirectory() as staging:
        train_warm_start(config, staging)
        Path(staging, "recipe.json").write_text(json.dumps(recipe, indent=2, sort_keys=True))
        store.put_dir(key, staging)
    return store.uri(key)
