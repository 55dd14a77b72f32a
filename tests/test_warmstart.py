"""Warm start: trained once per recipe, cached in the artifact store, found by later runs."""
from __future__ import annotations

import pytest

from tailflow.config import ConfigError, load_config
from tailflow.engines.store import LocalStore
from tailflow.driver.inputs import resolve_model_path, shipped_warmstart_dir


@pytest.mark.slow
def test_warm_start_is_cached_and_reused(prefect_api, tmp_path):
    """Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it): the fast subset starts no server; this test's own part is
    ~3 s."""
    from tailflow.flows.warmstart import warm_start

    overrides = [f"storage.uri={tmp_path}", "warmstart.steps=3", "warmstart.batch_size=4", "data.num_train=64"]
    first = warm_start(overrides=overrides)
    weights = tmp_path.joinpath(first.split(str(tmp_path) + "/")[1], "model.safetensors")
    stamp = weights.stat().st_mtime_ns
    assert warm_start(overrides=overrides) == first  # cached: not trained again
    assert weights.stat().st_mtime_ns == stamp

    config = load_config(None, overrides)
    assert resolve_model_path(config, LocalStore(tmp_path)) == first
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(first)
    assert AutoTokenizer.from_pretrained(first)("12+3\n")["input_ids"]


def test_runs_without_a_cached_recipe_use_the_shipped_one_or_say_what_to_do(tmp_path):
    store = LocalStore(tmp_path)
    assert resolve_model_path(load_config(None), store) == str(shipped_warmstart_dir())
    with pytest.raises(ConfigError, match="run `tailflow warmstart`"):
        resolve_model_path(load_config(None, ["warmstart.steps=7"]), store)
