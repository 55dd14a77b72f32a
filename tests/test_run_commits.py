"""The commit protocol and the checkpoint format: what a resumed run reads back is what was committed."""
from __future__ import annotations

import random

import pytest
import torch

from tailflow.config import TrainConfig
from tailflow.engines.models import build_tiny_model
from tailflow.engines.run_state import RngState, RunState
from tailflow.engines.runs.checkpoint import OPTIMIZER_FILE, read_checkpoint, weights_sha256, write_checkpoint
from tailflow.engines.runs.commit import CommitError, commit_state, prune_checkpoints, read_committed_state
from tailflow.engines.runs.layout import checkpoint_key, latest_key, state_key
from tailflow.engines.store import LocalStore
from tailflow.engines.tail.queue import LongPromptQueue
from tailflow.engines.tail.state import TailState
from tailflow.engines.train.batch import TrainSample
from tailflow.engines.train.trainer import PolicyTrainer

torch.set_num_threads(1)


def committed(run_id: str, iteration: int, queue: LongPromptQueue | None = None) -> RunState:
    return RunState(run_id=run_id, iteration=iteration, weight_version=iteration,
                    latest_checkpoint=checkpoint_key(run_id, iteration - 1) if iteration else None,
                    tail=TailState(queue=tuple((queue or LongPromptQueue()).prompts())), round_history=[0] * iteration)


def test_readers_see_only_what_latest_names(tmp_path):
    store = LocalStore(tmp_path)
    assert read_committed_state(store, "r") is None
    queue = LongPromptQueue()
    queue.defer(["p3", "p7"], iteration=0)
    commit_state(store, committed("r", 1, queue))
    assert read_committed_state(store, "r") == committed("r", 1, queue)

    # a crash after the next state was written but before `latest` moved: the reader keeps iteration 1
    def crash():
        raise KeyboardInterrupt("killed between state and pointer")

    with pytest.raises(KeyboardInterrupt):
        commit_state(store, committed("r", 2), before_pointer=crash)
    assert store.exists(state_key("r", 1))
    assert read_committed_state(store, "r").iteration == 1
    assert [entry.problem_id for entry in read_committed_state(store, "r").tail.queue] == ["p3", "p7"]

    commit_state(store, committed("r", 2))
    assert read_committed_state(store, "r").iteration == 2


def test_a_pointer_to_a_missing_or_different_state_is_an_error_not_a_fresh_start(tmp_path):
    store = LocalStore(tmp_path)
    commit_state(store, committed("r", 1))
    store.write_text(latest_key("r"), store.read_text(latest_key("r")).replace("iter-0000", "iter-0009"))
    with pytest.raises(CommitError, match="iter-0009.json"):
        read_committed_state(store, "r")
    store.write_text(latest_key("r"), "{not json")
    with pytest.raises(CommitError, match="latest.json"):
        read_committed_state(store, "r")


def test_retention_keeps_the_newest_the_multiples_and_the_committed_one(tmp_path):
    store = LocalStore(tmp_path)
    for iteration in range(12):
        store.write_text(f"{checkpoint_key('r', iteration)}/model.safetensors", "w")
    deleted = prune_checkpoints(store, "r", keep_last=2, keep_every=5, protected=checkpoint_key("r", 3))
    assert store.list_dir("r/checkpoints") == ["iter-0003", "iter-0004", "iter-0009", "iter-0010", "iter-0011"]
    assert checkpoint_key("r", 0) in deleted and checkpoint_key("r", 3) not in deleted


def test_rng_state_round_trips_through_json():
    captured = RngState.capture(engine_seed=7)
    draws = (random.random(), torch.rand(3).tolist())
    RngState.model_validate_json(captured.model_dump_json()).restore()
    assert (random.random(), torch.rand(3).tolist()) == draws


def samples(seed: int) -> list[TrainSample]:
    rng = random.Random(seed)
    return [TrainSample(tuple(rng.randrange(3, 22) for _ in range(5)), tuple(rng.randrange(3, 22) for _ in range(9)),
                        rng.choice([-1.0, 1.0])) for _ in range(6)]


def test_a_trainer_resumed_from_a_checkpoint_takes_the_same_next_step(random_tiny_model_dir, tmp_path):
    """Model + Adam state written, read back into a fresh trainer: step 3 equals the uninterrupted one's."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    def count(batch):
        return sum(len(s.response_token_ids) for s in batch)

    uninterrupted = PolicyTrainer(str(random_tiny_model_dir), TrainConfig(lr=1e-3))
    for step in range(2):
        uninterrupted.train_step(samples(step), count(samples(step)))
    checkpoint_dir = tmp_path / "ckpt"
    write_checkpoint(checkpoint_dir, uninterrupted.state_for_checkpoint(), AutoConfig.from_pretrained(random_tiny_model_dir),
                     AutoTokenizer.from_pretrained(random_tiny_model_dir))
    assert (checkpoint_dir / OPTIMIZER_FILE).is_file()
    AutoModelForCausalLM.from_pretrained(checkpoint_dir)  # an HF directory as it is
    AutoTokenizer.from_pretrained(checkpoint_dir)

    resumed = PolicyTrainer(str(random_tiny_model_dir), TrainConfig(lr=1e-3))
    resumed.load_checkpoint(read_checkpoint(checkpoint_dir, AutoConfig.from_pretrained(random_tiny_model_dir)))
    for trainer in (uninterrupted, resumed):
        trainer.train_step(samples(2), count(samples(2)))
    after, again = uninterrupted.full_state_dict(), resumed.full_state_dict()
    assert all(torch.equal(after[name], again[name]) for name in after)

    # without the optimizer state the same step lands elsewhere: the test can tell the difference
    weights_only = PolicyTrainer(str(random_tiny_model_dir), TrainConfig(lr=1e-3))
    weights_only.load_checkpoint({**read_checkpoint(checkpoint_dir, AutoConfig.from_pretrained(random_tiny_model_dir)),
                                  "optimizer": None})
    weights_only.train_step(samples(2), count(samples(2)))
    assert not all(torch.equal(after[name], weights_only.full_state_dict()[name]) for name in after)


def test_weights_sha256_depends_only_on_the_weights(random_tiny_model_dir, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    model = build_tiny_model(22, 1, 0, seed=0)
    config, tokenizer = AutoConfig.from_pretrained(random_tiny_model_dir), AutoTokenizer.from_pretrained(random_tiny_model_dir)
    for name in ("a", "b"):
        write_checkpoint(tmp_path / name, {"model": model.state_dict(), "optimizer": None}, config, tokenizer)
    assert weights_sha256(tmp_path / "a") == weights_sha256(tmp_path / "b")
    other = build_tiny_model(22, 1, 0, seed=1)
    write_checkpoint(tmp_path / "c", {"model": other.state_dict(), "optimizer": None}, config, tokenizer)
    assert weights_sha256(tmp_path / "c") != weights_sha256(tmp_path / "a")


def test_a_resume_with_a_changed_config_is_refused_unless_the_keys_are_named(tmp_path):
    from tailflow.config import ConfigError, config_to_yaml, load_config
    from tailflow.driver.resume import check_config_for_resume
    from tailflow.engines.runs.layout import saved_config

    store = LocalStore(tmp_path)
    started = load_config(None, [f"storage.uri={tmp_path}", "train.iterations=10"])
    store.write_text("r/config.yaml", config_to_yaml(started))
    longer = load_config(None, [f"storage.uri={tmp_path}", "train.iterations=20", "train.lr=1e-3"])

    with pytest.raises(ConfigError, match="train.lr changed; .*--allow-change train.lr$"):
        check_config_for_resume(store, "r", longer, allow_change=["train.iterations"])
    assert saved_config(store, "r") == started  # nothing rewritten by a refused resume

    check_config_for_resume(store, "r", longer, allow_change=["train.iterations", "train.lr"])
    assert saved_config(store, "r") == longer  # the run now records what it continues with
    check_config_for_resume(store, "r", longer, allow_change=[])  # the same config needs no permission


def test_the_rollout_workers_added_at_runtime_are_committed_and_older_states_read_as_none(tmp_path):
    store = LocalStore(tmp_path)
    state = committed("r", 1).model_copy(update={"rollout_workers_added": 2})
    commit_state(store, state)
    assert read_committed_state(store, "r").rollout_workers_added == 2
    assert state.committed("r/ckpt", "abc", RngState.capture(0)).rollout_workers_added == 2
    older = committed("r", 1).model_dump(mode="json")
    del older["rollout_workers_added"]  # a state committed before the field existed
    assert RunState.model_validate(older).rollout_workers_added == 0
