"""Asynchronous runs survive SIGKILL with nothing lost: the rounds running ahead and the requests in flight are
committed, and a resumed run ends with the same weights, metrics and queue as one never interrupted.

The deterministic mode of the issue: one rollout worker, and the rollout advances a fixed number of engine
steps per train step (`rollout.async_steps_per_train`), so what runs depends on no clock. On both rollout
engines: the vLLM one (vLLM's CPU build, marked `vllm`) continues the committed requests in flight from their
tokens as the native one does, drawing what they would have drawn.
"""
from __future__ import annotations

import functools
import signal

import pytest
import yaml

from durable_cli import outcome
from durable_cli import run_cli as run_cli_of
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.engines.track.rollout_trace import RolloutTraceLog
from tailflow.driver.inputs import shipped_warmstart_dir

pytestmark = [pytest.mark.slow, pytest.mark.long]


ENGINES = ["native", pytest.param("vllm", marks=pytest.mark.vllm)]

HANG_S = {"native": 300, "vllm": 900}
"""A CLI run's hang guard: a vLLM rollout actor first imports vLLM (tens of seconds, minutes on a busy machine)."""


def async_config(storage, engine: str = "native") -> dict:
    """Tail batching inside alpha = 1 rounds (a long round at iteration 2), partial rollout, TIS; one rollout
    worker and a fixed number of engine steps per train step (the deterministic mode)."""
    return {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 24, "num_slots": 16, "async_ratio": 1, "async_steps_per_train": 6,
                    "engine": engine},
        "train": {"iterations": 3, "eval_every": 2, "num_workers": 2, "lr": 1e-3, "loss": "tis"},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5},
        "reward": {"max_workers": 1},  # as tests/durable_cli.py's run: one reward actor to start, not three
        "storage": {"uri": str(storage)},
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sigkilled_async_run_resumes_to_exactly_the_uninterrupted_result(tmp_path, cli_env, engine):  # noqa: F811
    """Costs ~208 s here with the native engine, ~264 s with vLLM (four CLI runs: the uninterrupted one, the
    SIGKILLed one, the refused synchronous resume and the resume; each but the refusal starts Ray, 4 or more
    actors and the Prefect flow). It cannot be cheaper: the SIGKILL needs a process of its own, and 3 iterations
    are the fewest where rounds run ahead across a commit (a long round at iteration 2)."""
    reference_dir, crashy_dir = tmp_path / "reference", tmp_path / "crashy"
    for storage in (reference_dir, crashy_dir):
        storage.mkdir()
        (storage / "run.yaml").write_text(yaml.safe_dump(async_config(storage, engine)))

    run_cli = functools.partial(run_cli_of, hang_s=HANG_S[engine])
    result = run_cli(["train", "-c", str(reference_dir / "run.yaml"), "--run-id", "async-clean"], cli_env)
    assert result.returncode == 0, result.stdout[-4000:]
    assert ("vLLM engine: vLLM 0.32.0 on cpu" in result.stdout) == (engine == "vllm")
    expected_state, expected_rows = outcome(reference_dir, "async-clean")
    assert expected_state.pipeline is not None and expected_state.pipeline.in_flight  # work really was in flight
    assert max(row["async/staleness_max"] for row in expected_rows) == 1
    assert any(row["async/mixed_version_responses"] for row in expected_rows)
    # the asynchronous run streams its rewards (responses of deferred prompts were scored as they finished, and
    # only streamed scoring scores those) and writes its rollout trace, one row per iteration
    assert any(row["reward/unused_scores"] > 0 for row in expected_rows)
    traced = RolloutTraceLog(LocalStore(reference_dir), "async-clean").rounds()
    assert [r.iteration for r in traced] == [0, 1, 2] and {r.round for r in traced} >= {"short", "long"}

    # the iteration subflows get the state without its pipeline (Prefect refuses parameters over 512 KB)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["iter-0001"])))
    # other tests on this server name flow runs `iter-0001` too, some without a `state` parameter
    states = [run.parameters["state"] for run in subflows
              if run.parameters.get("state", {}).get("run_id") == "async-clean"]
    assert states and all(state["pipeline"] is None for state in states)

    train = ["train", "-c", str(crashy_dir / "run.yaml"), "--run-id", "async-crashy"]
    store = LocalStore(crashy_dir)
    # killed while training, the next round rolling meanwhile
    result = run_cli(train, cli_env, "crash-train@1")
    assert result.returncode == -signal.SIGKILL, f"exit {result.returncode}\n{result.stdout[-3000:]}"
    state = read_committed_state(store, "async-crashy")
    assert state.iteration == 1
    assert state.pipeline.rounds and state.pipeline.in_flight, "the commit holds the rounds running ahead"
    # going synchronous would drop the rounds running ahead: refused, and the commit is untouched
    refused = run_cli([*train, "--set", "rollout.async_ratio=0", "--allow-change", "rollout.async_ratio"], cli_env)
    assert refused.returncode != 0 and "resume with rollout.async_ratio >= 1" in refused.stdout
    assert read_committed_state(store, "async-crashy") == state

    result = run_cli(train, cli_env)
    assert result.returncode == 0, result.stdout[-4000:]

    state, rows = outcome(crashy_dir, "async-crashy")
    assert rows == expected_rows
    assert state.weights_sha256 == expected_state.weights_sha256
    assert state.tail == expected_state.tail and state.pipeline == expected_state.pipeline
