"""Check the user's inputs before anything is written: the model directory, the tokenizer, every dataset row,
the TensorBoard package and vLLM when asked for, and that `cluster.address` lets this driver attach.

A bad dataset used to surface inside `build_context`, after `prepare_run_dir`
had written `<run>/config.yaml`, leaving a run that `tailflow runs list` shows
as "not started". Here the same loaders run first, read-only (`load_inputs`,
which `build_context` runs too), so an error is one line naming the field,
file and row, and the store is untouched. The datasets are loaded again by the
run itself (a few seconds for the default 20,000 problems).
"""
from __future__ import annotations

from tailflow.config import RunConfig
from tailflow.driver.inputs import load_inputs
from tailflow.engines.cluster.attach import check_attach
from tailflow.engines.rollout.vllm_engine import require_vllm
from tailflow.engines.store import open_store
from tailflow.engines.track.tensorboard import require_tensorboard


def check_inputs(config: RunConfig) -> None:
    """Raise the user error a run with `config` would end with in its setup (ConfigError, DatasetError,
    UnsupportedModelError), without writing anything."""
    load_inputs(config, open_store(config.storage.uri))
    if config.tracking.tensorboard:
        require_tensorboard()
    if config.rollout.engine == "vllm":
        require_vllm()
    check_attach(config.cluster.address)
