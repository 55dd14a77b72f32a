"""Durable runs end to end: real processes SIGKILLed at every phase, resumed, compared with a clean run.

Each run is `python -m tailflow.cli train` in its own session (process group),
so a kill takes the driver and whatever it started with it, as a lost node
would. The fault points are engines/faults.py's (TAILFLOW_FAULT).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from tailflow.engines.runs.checkpoint import weights_sha256
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.engines.track.metrics import without_timing
from tailflow.flows.setup import shipped_warmstart_dir

pytestmark = pytest.mark.slow



def run_config(storage) -> dict:
    """3 iterations, tail batching with a long round at iteration 2 (so the queue crosses commits),
    one rollout worker (bit-for-bit), two FSDP ranks (sharded optimizer state)."""
    return {
        "model": {"path": str(shipped_warmstart_dir())},
        "data": {"num_train": 64, "num_eval": 8, "prompts_per_step": 4},
        "rollout": {"n": 4, "max_new_tokens": 24, "num_slots": 16},
        "train": {"iterations": 3, "eval_every": 2, "num_workers": 2, "lr": 1e-3},
        "tail": {"enabled": True, "prompt_ratio": 1.5, "responses_launched": 5},
        "storage": {"uri": str(storage)},
    }


@pytest.fixture(scope="module")
def cli_env(prefect_api):
    """The children talk to this session's Prefect server instead of starting their own."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    env.pop("TAILFLOW_FAULT", None)
    return env


def run_cli(args: list[str], env: dict, fault: str | None = None, hang_s: int = 300) -> subprocess.CompletedProcess:
    """`tailflow <args>` in a process group of its own; killed and failed as hung after `hang_s`."""
    child_env = dict(env, **({"TAILFLOW_FAULT": fault} if fault else {}))
    process = subprocess.Popen([sys.executable, "-m", "tailflow.cli", *args], env=child_env, start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=hang_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{' '.join(args)} (TAILFLOW_FAULT={fault}) hung for {hang_s} s:\n{output[-4000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what the driver started dies with it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(process.args, process.returncode, output, "")


def outcome(storage, run_id: str, ignore: tuple[str, ...] = ()):
    state = read_committed_state(LocalStore(storage), run_id)
    rows = [json.loads(line) for line in (storage / run_id / "metrics.jsonl").read_text().splitlines()]
    untimed = [{k: v for k, v in without_timing(row).items() if k not in ignore} for row in rows]
    return state, untimed


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cli_env):
    storage = tmp_path_factory.mktemp("reference")
    config_path = storage / "run.yaml"
    config_path.write_text(yaml.safe_dump(run_config(storage)))
    result = run_cli(["train", "-c", str(config_path), "--run-id", "clean"], cli_env)
    assert result.returncode == 0, result.stdout[-4000:]
    state, rows = outcome(storage, "clean")
    assert state.iteration == 3 and state.round_history == [0, 0, 1]
    return state, rows


EVERY_PHASE = [("crash-rollout@1", 1), ("crash-reward@1", 1), ("crash-train@1", 1), ("crash-sync@1", 1),
               ("crash-checkpoint@1", 1), ("crash-commit@2", 2)]
"""(fault, iterations committed after the kill): a SIGKILL in each phase of an iteration."""

AROUND_THE_COMMIT = [("crash-checkpoint@1", 1), ("crash-commit@2", 2)]
"""The two kills the commit protocol exists for: a checkpoint stored but not committed, a commit cut short."""


def test_sigkill_around_the_commit_then_resume_ends_exactly_where_a_clean_run_does(tmp_path, cli_env, reference):
    kill_then_resume(tmp_path, cli_env, reference, "crashy", AROUND_THE_COMMIT)


@pytest.mark.long  # seven runs: ~4.5 min
def test_sigkill_in_every_phase_then_resume_ends_exactly_where_a_clean_run_does(tmp_path, cli_env, reference):
    kill_then_resume(tmp_path, cli_env, reference, "crashy-every", EVERY_PHASE)


def kill_then_resume(tmp_path, cli_env, reference, run_id: str, faults: list[tuple[str, int]]) -> None:
    """Run `run_id` once per fault, each SIGKILLed there, then resume it: it must end with the clean run's
    weights, queue and metrics rows, every killed flow run marked Crashed."""
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(run_config(tmp_path)))
    train = ["train", "-c", str(config_path), "--run-id", run_id]
    store = LocalStore(tmp_path)

    for fault, committed in faults:
        result = run_cli(train, cli_env, fault)
        assert result.returncode == -signal.SIGKILL, f"{fault}: exit {result.returncode}\n{result.stdout[-3000:]}"
        assert "fault injection: SIGKILL" in result.stdout
        state = read_committed_state(store, run_id)
        assert state.iteration == committed, fault
        if fault == "crash-checkpoint@1":
            # iteration 1's checkpoint is stored but was never committed: the previous one is what counts
            assert store.has_dir(f"{run_id}/checkpoints/iter-0001")
            assert state.latest_checkpoint == f"{run_id}/checkpoints/iter-0000"
            assert weights_sha256(tmp_path / state.latest_checkpoint) == state.weights_sha256

    # the last resume by `tailflow resume` with the run's own saved config
    result = run_cli(["resume", run_id, "--set", f"storage.uri={tmp_path}"], cli_env)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "resuming after iteration 0001" in result.stdout

    expected_state, expected_rows = reference
    state, rows = outcome(tmp_path, run_id)
    assert rows == expected_rows  # one row per iteration, none duplicated by the re-runs
    assert state.weights_sha256 == expected_state.weights_sha256
    assert state.tail == expected_state.tail

    # every SIGKILLed flow run was marked Crashed by the run that took its lease; the last one completed
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_id])),
                                     sort=FlowRunSort.START_TIME_ASC)
    assert [run.state.type.value for run in runs] == ["CRASHED"] * len(faults) + ["COMPLETED"]
    assert all("stopped without reporting" in run.state.message for run in runs[:len(faults)])
    assert not (tmp_path / ".leases" / f"{run_id}.json").exists()


def test_a_dead_trainer_or_reward_actor_costs_a_retry_and_a_dead_rollout_worker_nothing(tmp_path, cli_env, reference):
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(run_config(tmp_path)))
    result = run_cli(["train", "-c", str(config_path), "--run-id", "actors"], cli_env,
                     fault="kill-reward@0,kill-rollout@1,kill-trainer@2")
    assert result.returncode == 0, result.stdout[-4000:]
    # the reward and trainer deaths restart their iteration; the rollout worker's does not (rollout.elastic:
    # its requests continue on a replacement from the tokens streamed so far)
    assert result.stdout.count("an actor died") == 2

    varying = ("iteration/attempt", "rollout/migrated_requests", "rollout/migrated_tokens")
    state, rows = outcome(tmp_path, "actors", ignore=varying)
    _, rows_with_attempts = outcome(tmp_path, "actors")
    assert [row["iteration/attempt"] for row in rows_with_attempts] == [1, 0, 1]
    expected_state, expected_rows = reference
    assert rows == [{k: v for k, v in row.items() if k not in varying} for row in expected_rows]
    assert state.weights_sha256 == expected_state.weights_sha256


def test_a_gpu_run_on_logical_gpus_ends_bit_for_bit_where_the_cpu_run_does(tmp_path, cli_env, reference):
    """`cluster.device: gpu` end to end on Ray's logical GPUs, tensors on the CPU (`TAILFLOW_CUDA_STAND_IN`, the
    named stand-in for the GPU this machine lacks): placement groups, the trainer ranks' rendezvous, the phases
    taking turns (engines asleep for each step, the trainer parked for each rollout and commit), and a trainer
    death mid-run (iteration 1 restarts: the reservation is released and made again). None of it may change a
    bit: the clean CPU run's weights and metrics rows."""
    config = run_config(tmp_path)
    config["cluster"] = {"device": "gpu", "num_gpus": 2}
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    result = run_cli(["train", "-c", str(config_path), "--run-id", "gpus"], dict(cli_env, TAILFLOW_CUDA_STAND_IN="cpu"),
                     fault="kill-trainer@1")
    assert result.returncode == 0, result.stdout[-4000:]
    assert result.stdout.count("an actor died") == 1
    for line in ("trainer rank 0: GPU ", "trainer rank 1: GPU ", "rollout worker 0: GPU "):
        assert result.stdout.count(line) == 2, line  # seated at start and again after the restart
    seats = {line.split(": GPU ")[0].split("] ")[-1]: line.split(": GPU ")[1].split()[0]
             for line in result.stdout.splitlines() if ": GPU " in line}
    assert seats["rollout worker 0"] == seats["trainer rank 0"] != seats["trainer rank 1"]

    state, rows = outcome(tmp_path, "gpus", ignore=("iteration/attempt",))
    expected_state, expected_rows = reference
    assert rows == [{k: v for k, v in row.items() if k != "iteration/attempt"} for row in expected_rows]
    assert state.weights_sha256 == expected_state.weights_sha256


def test_a_retried_flow_run_resumes_from_its_last_commit(tmp_path, prefect_api, reference, monkeypatch):
    """The parent flow's own retry (as the UI's Retry button does): same flow run, same run id, no lost or
    repeated iteration. The driver raises in iteration 2's train phase on the first attempt only."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from tailflow.flows.training import rl_training

    monkeypatch.setenv("TAILFLOW_FAULT", "raise-train@2")
    summary = rl_training.with_options(retry_delay_seconds=0)(config=run_config(tmp_path))
    state, rows = outcome(tmp_path, summary.run_id)
    expected_state, expected_rows = reference
    assert rows == expected_rows and state.weights_sha256 == expected_state.weights_sha256

    async def parent_run():
        async with get_client() as client:
            runs = await client.read_flow_runs(limit=200, sort=FlowRunSort.START_TIME_DESC)
            return next(run for run in runs if run.name == summary.run_id)

    run = asyncio.run(parent_run())
    assert run.run_count == 2 and run.state.is_completed()
    assert summary.run_id == f"run-{str(run.id)[:8]}"  # the run id came from the flow run, so the retry found it


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 behind the fault proxy of the store tests."""
    from moto.server import ThreadedMotoServer

    from s3_faults import FaultProxy

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    proxy = FaultProxy(*server.get_host_and_port()).start()
    yield server.get_host_and_port(), proxy
    proxy.stop()
    server.stop()


@pytest.mark.long
def test_a_run_on_s3_through_transient_faults_matches_the_local_run(tmp_path, cli_env, reference, s3_endpoint,
                                                                    monkeypatch):
    """Every 5th S3 request fails (503 Slow Down, or the connection reset); the run rides through on retries,
    and what `latest` names is whole and verified (sha256) and equal to the local run's result."""
    import boto3

    from tailflow.engines.store import S3Store

    (host, port), proxy = s3_endpoint
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")  # the test's own view: moto directly
    boto3.client("s3").create_bucket(Bucket="runs")

    config = run_config("s3://runs/team")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = dict(cli_env, **aws, AWS_ENDPOINT_URL=proxy.url, HOME=str(tmp_path))  # the run's: through the proxy
    proxy.inject_every("503", 5)
    first = run_cli(["train", "-c", str(config_path), "--run-id", "on-s3"], env, fault="crash-train@2")
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:]
    proxy.inject_every("reset", 5)
    second = run_cli(["resume", "on-s3", "--set", "storage.uri=s3://runs/team"], env)
    assert second.returncode == 0, second.stdout[-4000:]
    assert proxy.faults_served > 0

    store = S3Store("runs", "team", cache_dir=tmp_path / "verify-cache")
    state = read_committed_state(store, "on-s3")
    checkpoint = store.local_dir(state.latest_checkpoint)  # every file checked against the manifest's sha256
    assert weights_sha256(checkpoint) == state.weights_sha256
    rows = [json.loads(line) for line in store.read_text("on-s3/metrics.jsonl").splitlines()]
    expected_state, expected_rows = reference
    assert [without_timing(row) for row in rows] == expected_rows
    assert state.weights_sha256 == expected_state.weights_sha256


@pytest.mark.long
def test_rollout_workers_added_at_runtime_survive_an_iteration_restart_and_a_resume(tmp_path, cli_env):
    """A run with one rollout worker is told to add one (`send_worker_command`, as `tailflow workers add`); a
    trainer death then restarts an iteration and a SIGKILL ends the run: the restart and the resume each start
    the added worker again, and every commit from then on records it."""
    from tailflow.engines.cluster.worker_control import WorkerCommand, send_worker_command

    config = run_config(tmp_path)
    config["train"].update(iterations=1, num_workers=1)
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    store = LocalStore(tmp_path)
    first = run_cli(["train", "-c", str(config_path), "--run-id", "grown"], cli_env)
    assert first.returncode == 0, first.stdout[-4000:]
    assert read_committed_state(store, "grown").rollout_workers_added == 0

    send_worker_command(store, "grown", WorkerCommand(add=1))  # taken at the next run's first poll
    more = ["resume", "grown", "--set", f"storage.uri={tmp_path}", "--set", "train.iterations=4",
            "--allow-change", "train.iterations"]
    second = run_cli(more, cli_env, fault="kill-trainer@2,crash-train@3")
    assert second.returncode == -signal.SIGKILL, second.stdout[-4000:]
    assert second.stdout.count("an actor died") == 1
    assert second.stdout.count("keeping the rollout workers added at runtime: 1 (rollout.num_workers) +1") == 1
    assert read_committed_state(store, "grown").iteration == 3
    assert read_committed_state(store, "grown").rollout_workers_added == 1

    third = run_cli(more, cli_env)
    assert third.returncode == 0, third.stdout[-4000:]
    assert "keeping the rollout workers added at runtime: 1 (rollout.num_workers) +1" in third.stdout
    state, rows = outcome(tmp_path, "grown")
    assert state.iteration == 4 and state.rollout_workers_added == 1
    assert len(rows) == 4


MEGATRON_HANG_S = 900
"""A Megatron run also imports megatron-core and builds its model in every trainer actor; on a loaded 2-core
machine (load ~25) its 3 iterations ran past 300 s without being stuck."""


def test_a_megatron_run_sigkilled_then_resumed_ends_bit_for_bit_where_its_clean_run_does(tmp_path, cli_env):
    """train.backend megatron (tensor parallel 2 on the two trainer actors, megatron-core's CPU stand-in): a run
    SIGKILLed in iteration 2's train phase resumes from iteration 1's commit, every rank from its own checkpoint
    shard (parameters and AdamW state), and ends with the clean Megatron run's weights, queue and metrics rows."""
    pytest.importorskip("megatron.core", reason="megatron-core (the `megatron` extra) is not installed")
    config = run_config(tmp_path)
    config["train"]["backend"] = "megatron"
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(config))
    clean = run_cli(["train", "-c", str(config_path), "--run-id", "megatron-clean"], cli_env, hang_s=MEGATRON_HANG_S)
    assert clean.returncode == 0, clean.stdout[-4000:]
    killed = run_cli(["train", "-c", str(config_path), "--run-id", "megatron-killed"], cli_env, "crash-train@2",
                     MEGATRON_HANG_S)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    store = LocalStore(tmp_path)
    state = read_committed_state(store, "megatron-killed")
    assert state.iteration == 2
    assert sorted(path.name for path in (tmp_path / state.latest_checkpoint / "megatron").iterdir()) == [
        "rank_00000.pt", "rank_00001.pt"]
    resumed = run_cli(["resume", "megatron-killed", "--set", f"storage.uri={tmp_path}"], cli_env,
                      hang_s=MEGATRON_HANG_S)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "resuming after iteration 0001" in resumed.stdout

    expected_state, expected_rows = outcome(tmp_path, "megatron-clean")
    state, rows = outcome(tmp_path, "megatron-killed")
    assert expected_state.iteration == 3 and rows == expected_rows
    assert state.weights_sha256 == expected_state.weights_sha256 and state.tail == expected_state.tail
