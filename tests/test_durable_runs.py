"""Durable runs end to end against one clean run: real processes SIGKILLed at every phase, actors killed, a
Prefect retry, S3 through faults, logical GPUs; each resumed or retried run must end bit for bit where the clean
run (`reference`) does. tests/durable_cli.py runs `tailflow` as a killable child; tests/test_durable_restarts.py
holds the durable runs that need a clean run of their own (so the two files run side by side under xdist).
"""
from __future__ import annotations

import json
import signal

import pytest
import yaml

from durable_cli import outcome, run_cli, run_config
from tailflow.engines.runs.checkpoint import weights_sha256
from tailflow.engines.runs.commit import read_committed_state
from tailflow.engines.store import LocalStore
from tailflow.engines.track.metrics import without_timing

pytestmark = pytest.mark.slow


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

@pytest.mark.long  # seven runs: ~4.5 min
def test_sigkill_in_every_phase_then_resume_ends_exactly_where_a_clean_run_does(tmp_path, cli_env, reference):
    """Costs ~466 s here (seven CLI runs: one SIGKILLed in each of six phases, then the resume; each starts Ray,
    4 or more actors and the Prefect flow); as the module's first test it also pays for the clean `reference`
    run. A SIGKILL needs a process of its own per phase, and every phase is what it checks."""
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


def test_a_gpu_run_on_logical_gpus_ends_bit_for_bit_where_the_cpu_run_does(tmp_path, cli_env, reference):
    """`cluster.device: gpu` end to end on Ray's logical GPUs, tensors on the CPU (`TAILFLOW_CUDA_STAND_IN`, the
    named stand-in for the GPU this machine lacks): placement groups, the trainer ranks' rendezvous, the phases
    taking turns (engines asleep for each step, the trainer parked for each rollout and commit), and a trainer
    death mid-run (iteration 1 restarts: the reservation is released and made again). None of it may change a
    bit: the clean CPU run's weights and metrics rows.
    Costs ~102 s here (one 3-iteration CLI run on Ray's logical GPUs, 4 or more actors and the Prefect flow, with a
    trainer death restarting iteration 1): the reservation's release and renewal only happens when an actor dies
    mid-run, and the comparison is with the whole clean run."""
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
    repeated iteration. The driver raises in iteration 2's train phase on the first attempt only.
    Costs ~87 s here (one 3-iteration run in-process against the test Prefect server, Ray and 4 or more actors,
    whose parent flow runs twice): the retry must reach iteration 2's train phase, past a commit, to show that
    nothing is lost or repeated."""
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
    and what `latest` names is whole and verified (sha256) and equal to the local run's result.
    On the way an actor of each kind dies, each in an iteration of its own so that its retry or its migration is
    seen alone: a reward actor (iteration 0) and a trainer rank (iteration 2, in the resumed run: the restarted
    group reloads iteration 1's checkpoint from S3 through the faults) each cost their iteration a restart; a
    rollout worker (iteration 1) costs nothing (rollout.elastic: its requests continue on a replacement from the
    tokens streamed so far). None of it may change the result.
    Costs ~160 s here (two CLI runs, SIGKILLed then resumed, each with Ray, 4 or more actors and the Prefect flow,
    storing through the fault proxy to moto S3 with every 5th request failing, two iterations restarting):
    resuming from S3 through faults is what it checks, and the retries on injected faults add to every upload.
    The actor deaths were a test of their own with its own 3-iteration run (~171 s); here they cost two iteration
    restarts."""
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
    first = run_cli(["train", "-c", str(config_path), "--run-id", "on-s3"], env,
                    fault="kill-reward@0,kill-rollout@1,crash-train@2")
    assert first.returncode == -signal.SIGKILL, first.stdout[-3000:]
    assert first.stdout.count("an actor died") == 1  # the reward actor's; the rollout worker's is migrated
    proxy.inject_every("reset", 5)
    second = run_cli(["resume", "on-s3", "--set", "storage.uri=s3://runs/team"], env, fault="kill-trainer@2")
    assert second.returncode == 0, second.stdout[-4000:]
    assert second.stdout.count("an actor died") == 1
    assert proxy.faults_served > 0

    store = S3Store("runs", "team", cache_dir=tmp_path / "verify-cache")
    state = read_committed_state(store, "on-s3")
    checkpoint = store.local_dir(state.latest_checkpoint)  # every file checked against the manifest's sha256
    assert weights_sha256(checkpoint) == state.weights_sha256
    rows = [without_timing(json.loads(line)) for line in store.read_text("on-s3/metrics.jsonl").splitlines()]
    assert [row["iteration/attempt"] for row in rows] == [1, 0, 1]  # the reward and trainer deaths restarted theirs
    varying = ("iteration/attempt", "rollout/migrated_requests", "rollout/migrated_tokens")
    expected_state, expected_rows = reference
    assert [{k: v for k, v in row.items() if k not in varying} for row in rows] == [
        {k: v for k, v in row.items() if k not in varying} for row in expected_rows]
    assert state.weights_sha256 == expected_state.weights_sha256
