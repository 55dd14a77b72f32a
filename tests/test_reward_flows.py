"""Training runs with the code and the judge rewards, through the normal flow (Prefect + Ray)."""
from __future__ import annotations

import json

import pytest

from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.driver.inputs import shipped_warmstart_dir

pytestmark = pytest.mark.slow


def rows_of(storage, run_id):
    return [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long
def test_judge_reward_run(prefect_api, tmp_path):
    """The tiny judge is the policy's own warm start; its vocabulary has no letters, so yes/no are '1'/'0'.
    Costs ~40 s here (a 2-iteration in-process run through Prefect with Ray, 2 trainer ranks, a rollout worker and
    1-2 judge reward workers): the judge's graded scores and the reward pool's scaling are seen only in a run whose
    reward workers score real rollouts."""
    from tailflow.flows.training import rl_training

    config = {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 32, "num_slots": 16},
        "reward": {"type": "judge", "judge_template": "{prompt}{response}?{reference}=", "judge_yes": "1",
                   "judge_no": "0", "min_workers": 1, "max_workers": 2},
        "train": {"iterations": 2, "eval_every": 1, "num_workers": 2, "lr": 1e-3},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5},
        "storage": {"uri": str(tmp_path)},
    }
    summary = rl_training(config=config, run_id="judged")
    rows = rows_of(tmp_path, "judged")
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        assert 0 < row["reward/mean"] < 1  # graded p(yes) / (p(yes) + p(no)), not 0/1
        assert 1 <= row["time/reward_workers"] <= 2
        assert 0 <= row["time/reward_overlap_ratio"] <= 1
        assert row["reward/timeouts"] == 0
    assert summary.final_accuracy is not None
    assert read_committed_state(LocalStore(tmp_path), "judged").iteration == 2


@pytest.mark.long
def test_code_reward_run(prefect_api, tmp_path, random_code_model_dir):
    """The built-in code task; the policy is a random printable-ASCII tiny model, so its programs fail, but
    every one of them runs in the sandbox on the reward workers, streamed.
    Costs ~50 s here (a 2-iteration in-process run through Prefect with Ray, 2 trainer ranks, a rollout worker and
    1-2 code reward workers, every response run in the sandbox): that the sandboxed scoring streams inside a real
    run is what it checks."""
    from tailflow.engines.reward.timeouts import TimeoutAnchors
    from tailflow.flows.training import rl_training

    config = {
        "model": {"path": str(random_code_model_dir)},
        "data": {"prompts_per_step": 4, "num_eval": 4},
        "rollout": {"n": 2, "max_new_tokens": 24, "num_slots": 16},
        "reward": {"type": "code", "min_workers": 1, "max_workers": 2, "timeout_max_s": 5.0},
        "train": {"iterations": 2, "eval_every": 1, "num_workers": 2},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 3},
        "storage": {"uri": str(tmp_path)},
    }
    rl_training(config=config, run_id="coded")
    rows = rows_of(tmp_path, "coded")
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        assert row["reward/mean"] == 0.0  # random text is not a program that passes tests
        assert row["time/reward_busy"] > 0  # the workers scored (a relation: how long a sandbox takes is the machine's)
        assert row["reward/timeouts"] == 0 and row["time/reward_timeout_anchor_s"] is None
    state = read_committed_state(LocalStore(tmp_path), "coded")
    assert state.iteration == 2 and state.reward_anchors == TimeoutAnchors()  # no correct response: no anchor


def test_code_datasets_come_from_the_configured_file():
    """~0 s: no run, it only loads two APPS rows from tests/data (in this slow module by topic, not by cost)."""
    from tailflow.config import config_from_dict
    from tailflow.driver.inputs import load_datasets

    data_file = str(__import__("pathlib").Path(__file__).parent / "data" / "apps_sample.jsonl")
    config = config_from_dict({"model": {"path": "/any"}, "reward": {"type": "code"},
                               "data": {"train_path": data_file, "eval_path": data_file, "code_format": "apps"}})
    datasets = load_datasets(config, tokenizer=None, max_prompt_tokens=None, runs_code=True)
    assert [p.problem_id for p in datasets.train] == ["101", "102"]
    assert datasets.train[0].tests.io_cases and datasets.train[1].tests.asserts
