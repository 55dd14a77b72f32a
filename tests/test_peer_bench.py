"""bench/peer.py's building blocks, without TRL: what it hands TRL matches the tailflow run it is compared with.

TRL is never installed here (scripts/peer_env.sh makes its own venv); the TRL
side runs only in the full benchmark. These check the pure parts: the
GRPOConfig arguments follow the synchronous run's config, the prompts handed
to TRL are the ones that run draws, in its order, and the two tailflow runs
differ only where they should. The tailflow side itself runs in
tests/test_bench_smoke.py (`-m bench`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import peer  # noqa: E402
from tailflow.config import config_from_dict  # noqa: E402


@pytest.fixture
def full_settings(tmp_path):
    settings, _ = peer.settings_from_args([])
    trees = peer.tailflow_trees(settings, tmp_path)
    return settings, {run_id: config_from_dict(tree) for run_id, tree in trees.items()}


def test_the_full_run_is_the_issues_workload(full_settings):
    settings, configs = full_settings
    assert (settings.steps, settings.prompts_per_step, settings.group_size, settings.max_new_tokens) == (20, 32, 8, 720)
    sync, default = configs["peer-sync"], configs["peer-default"]
    assert (sync.rollout.async_ratio, sync.train.loss, sync.tail.enabled) == (0, "ppo_clip", False)
    assert (default.rollout.async_ratio, default.train.loss, default.tail.enabled) == (1, "decoupled_ppo", True)
    for config in (sync, default):
        assert (config.data.prompts_per_step, config.rollout.n, config.rollout.max_new_tokens) == (32, 8, 720)
        assert (config.train.iterations, config.train.kl_coef, config.train.loss_agg) == (20, 0.0, "token_mean")


def test_trl_gets_the_synchronous_runs_algorithm(full_settings):
    _, configs = full_settings
    sync = configs["peer-sync"]
    kwargs = peer.trl_config_kwargs(sync, "/tmp/out")
    # one optimizer step per batch of 32 prompts x 8 responses: micro-batches of 4 prompts, accumulated
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 32 * 8
    assert kwargs["num_generations"] == 8 and kwargs["num_iterations"] == 1 and kwargs["max_steps"] == 20
    assert kwargs["max_completion_length"] == 720 and not kwargs["shuffle_dataset"]  # tailflow's order, as is
    assert (kwargs["learning_rate"], kwargs["max_grad_norm"], kwargs["weight_decay"]) == \
           (sync.train.lr, sync.train.max_grad_norm, sync.train.weight_decay)
    assert (kwargs["epsilon"], kwargs["epsilon_high"], kwargs["beta"]) == (sync.train.clip_low, sync.train.clip_high, 0.0)
    assert kwargs["loss_type"] == "dapo" and kwargs["scale_rewards"] == "group"  # token_mean and GRPO's group std
    assert kwargs["lr_scheduler_type"] == "constant" and kwargs["bf16"] is False and kwargs["use_cpu"] is True
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"]) == (1.0, 1.0, 0)
    assert kwargs["disable_dropout"] and kwargs["seed"] == sync.train.seed


def test_trl_gets_the_prompts_the_synchronous_run_draws_in_its_order(tmp_path):
    """Quick settings: the prompts handed to TRL are P0 a step from tailflow's data cursor, formatted by the run's
    template, with their gold answers and tailflow's math reward options."""
    from tailflow.engines.data.arith import default_splits
    from tailflow.engines.data.cursor import epoch_order

    settings, _ = peer.settings_from_args(["--quick", "--steps", "3"])
    sync = config_from_dict(peer.tailflow_trees(settings, tmp_path)["peer-sync"])
    problems = peer.prompt_order(sync)
    train, _ = default_splits(settings.num_train, settings.num_eval, settings.seed)
    expected = [train[i] for i in epoch_order(len(train), settings.seed, 0)[:3 * settings.prompts_per_step]]
    assert [p.problem_id for p in problems] == [p.problem_id for p in expected]
    spec = peer.trl_spec(sync, problems, tmp_path)
    assert spec["prompts"] == [p.prompt for p in expected] and spec["answers"] == [p.answer for p in expected]
    assert spec["reward"] == {"format_reward": 0.0, "answer_marker": "####", "literal_answers_only": True}
    assert spec["config"]["per_device_train_batch_size"] * spec["config"]["gradient_accumulation_steps"] == 2 * 4


def test_the_verdict_names_each_target():
    assert peer.verdict(3.5, 4.0, -1.0, 0.5).endswith("all targets met")
    missed = peer.verdict(2.0, 1.5, -3.0, -1.0)
    assert missed.endswith("4 of 4 missed") and "sync 2.00x per step MISSES >= 3x" in missed
