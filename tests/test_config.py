import pytest

from tailflow.config import ConfigError, apply_override, config_sections, load_config


def test_defaults_and_overrides_parse_yaml_values(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  iterations: 7\nrollout:\n  n: 4\n")
    config = load_config(path, ["train.lr=2e-5", "tail.enabled=true", "data.train_path=null"])
    assert config.train.iterations == 7
    assert config.rollout.n == 4
    assert config.train.lr == pytest.approx(2e-5)
    assert config.tail.enabled is True
    assert config.responses_launched == 5  # R0 + ceil(R0 / 4)


@pytest.mark.parametrize(
    "override, named",
    [
        ("train.lrr=1", "train.lrr: unknown key"),
        ("trian.lr=1", "trian: unknown key"),
        ("train.lr=-1", "train.lr"),
        ("rollout.n=abc", "rollout.n"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("tail.responses_launched=3", "tail.responses_launched"),
    ],
)
def test_bad_values_name_the_key(override, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(None, [override])


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listing)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="key=value"):
        apply_override({}, "train.lr")
    with pytest.raises(ConfigError, match="train is not a section"):
        apply_override({"train": 3}, "train.lr=1")


def test_custom_data_needs_eval_and_model():
    with pytest.raises(ConfigError, match="data.eval_path is required"):
        load_config(None, ["data.train_path=/x.jsonl", "model.path=/m"])


def test_every_field_is_documented():
    """Docstrings become CLI/UI help: a field without one is a bug."""
    for section_name, section in config_sections().items():
        for name, field in section.model_fields.items():
            if name in {"temperature", "top_p", "lr", "weight_decay", "max_grad_norm", "clip_low", "clip_high",
                        "batch_size", "seed", "wandb_project"}:
                continue  # self-explanatory to anyone who trains models
            assert field.description, f"{section_name}.{name} has no docstring"


def test_configuration_reference_is_current():
    from pathlib import Path

    from tailflow.config import config_reference_markdown

    committed = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    assert committed == config_reference_markdown(), "regenerate: tailflow config --reference > docs/configuration.md"


def test_the_rollout_engine_is_native_unless_vllm_is_asked_for_on_either_device():
    assert load_config(None, []).rollout.engine == "native"
    with pytest.raises(ConfigError, match=r"rollout\.engine"):
        load_config(None, ["rollout.engine=sglang"])
    assert load_config(None, ["rollout.engine=vllm"]).rollout.engine == "vllm"  # vLLM's CPU build
    assert load_config(None, ["rollout.engine=vllm", "cluster.device=gpu"]).rollout.engine == "vllm"


def test_async_training_needs_an_importance_corrected_loss_and_a_ratio_of_at_least_one():
    with pytest.raises(ConfigError, match="rollout.async_ratio 1.0 trains on responses sampled by older weights"):
        load_config(None, ["rollout.async_ratio=1"])
    with pytest.raises(ConfigError, match="rollout.async_ratio 0.5: use 0 .synchronous. or >= 1"):
        load_config(None, ["rollout.async_ratio=0.5", "train.loss=tis"])
    config = load_config(None, ["rollout.async_ratio=2", "train.loss=decoupled_ppo"])
    assert config.rollout.async_ratio == 2 and config.rollout.partial and config.rollout.async_steps_per_train == 0
    with pytest.raises(ConfigError, match="train.stream streams a synchronous round"):
        load_config(None, ["rollout.async_ratio=1", "train.loss=tis", "train.stream=true"])


CALCULATOR = "tailflow.engines.env.builtin.calculator:Calculator"


def test_the_env_section_is_absent_by_default_and_parses_when_given():
    assert load_config(None, []).env is None
    env = load_config(None, [f"env.class_path={CALCULATOR}", "env.max_turns=3", "env.settings={max_terms: 4}",
                             "rollout.elastic=false"]).env
    assert (env.max_turns, env.settings, env.invalid_action_observation) == (3, {"max_terms": 4}, "?\n")


@pytest.mark.parametrize(
    "override, named",
    [
        ("env.class_path=tailflow.engines.env.builtin.calculater:Calculator", "env.class_path: cannot import"),
        ("env.class_path=tailflow.config:RunConfig", "env.class_path: .* is not a subclass"),
        ("env.max_turns=0", "env.max_turns"),
        ("env.step_timeout_s=0", "env.step_timeout_s"),
        ("env.reset_retries=-1", "env.reset_retries"),
        ("env.invalid_action_reward=0.5", "env.invalid_action_reward"),
        ("env.turn_max_tokens=2000", r"env.turn_max_tokens \(2000\) must be <= env.trajectory_max_tokens"),
        ("env.settings={a: {b: 1}}", "env.settings.a"),
        ("env.max_turn=3", "env.max_turn: unknown key"),
    ],
)
def test_bad_env_values_name_the_field(override, named):
    overrides = [override] if override.startswith("env.class_path") else [f"env.class_path={CALCULATOR}", override]
    overrides.append("rollout.elastic=false")
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace(r"\.*", ".*")):
        load_config(None, overrides)


def test_an_env_section_without_a_class_path_names_it():
    with pytest.raises(ConfigError, match=r"env\.class_path: Field required"):
        load_config(None, ["env.max_turns=3"])


def test_elastic_migration_is_refused_with_env_and_the_modes_that_continue_trajectories_load():
    """A lost worker's requests migrate from the tokens it streamed, which lack a trajectory's turns: refused by
    name with the fix. Partial async rollouts and tail.continue_deferred hand an aborted trajectory on whole
    (replayed into a fresh environment): they load."""
    with pytest.raises(ConfigError, match=r"rollout\.elastic migrates .*set rollout\.elastic false"):
        load_config(None, [f"env.class_path={CALCULATOR}"])
    config = load_config(None, [f"env.class_path={CALCULATOR}", "rollout.elastic=false", "rollout.async_ratio=1",
                                "tail.continue_deferred=true", "train.loss=decoupled_ppo"])
    assert config.rollout.partial and config.tail.continue_deferred and config.env is not None


def test_the_agentic_docs_example_config_loads(tmp_path):
    """docs/agentic.md's `env` example is a config that loads (its class path imports, its keys exist)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "agentic.md").read_text()
    (tmp_path / "run.yaml").write_text(re.search(r"```yaml\n(env:.*?)```", text, re.S).group(1))
    config = load_config(str(tmp_path / "run.yaml"), [])
    assert config.env.class_path.endswith("guess:Guess") and config.env.turn_stop_texts == ["\n"]


def test_a_critic_is_configured_under_train_and_refused_where_it_cannot_work():
    config = load_config(None, ["train.advantage=gae", "train.critic.lam=0.9", "rollout.n=1"])
    assert config.train.critic.lam == 0.9 and config.train.critic.gamma == 1.0 and config.rollout.n == 1
    with pytest.raises(ConfigError, match=r"train\.critic\.lam"):
        load_config(None, ["train.advantage=gae", "train.critic.lam=1.5"])
    with pytest.raises(ConfigError, match="gae cannot stream"):
        load_config(None, ["train.advantage=gae", "train.stream=true", "reward.streaming=true"])
    megatron = load_config(None, ["train.advantage=gae", "train.backend=megatron", "train.num_workers=2",
                                  "train.tensor_parallel=2"])
    assert megatron.train.has_critic and megatron.train.tensor_parallel_size == 2
