"""A Prefect server that goes away under a running flow (driver/prefect_outage.py): the run pauses or runs the
iteration again from its last commit, and ends with every iteration committed once."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from durable_cli import outcome, run_config
from prefect_server import PrefectServer
from tailflow.driver import prefect_outage
from tailflow.driver.run_log import tolerated
from tailflow.engines.run_state import RunState


def test_an_outage_is_told_from_other_errors_through_its_causes():
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    try:
        try:
            raise refused
        except httpx.ConnectError as error:
            raise RuntimeError("Task run encountered an exception") from error
    except RuntimeError as wrapped:
        assert prefect_outage.is_prefect_outage(wrapped)
    assert not prefect_outage.is_prefect_outage(ValueError("train.lrr: unknown key"))
    with tolerated("an artifact"):
        raise refused  # swallowed: only what the UI shows is lost
    with pytest.raises(KeyError), tolerated("an artifact"):
        raise KeyError("not an outage")


@pytest.mark.parametrize("committed_before_failing", [False, True])
def test_run_iteration_waits_out_an_outage_and_never_runs_a_committed_iteration_twice(monkeypatch,
                                                                                      committed_before_failing):
    """The outage branch of flows/training.run_iteration with the iteration, the actors and the store replaced:
    an iteration whose subflow failed before its commit runs again from the last commit; one that had committed
    is not run again, and the run goes on from that commit."""
    from types import SimpleNamespace

    from tailflow.flows import training

    before = RunState(run_id="r", iteration=3)
    after = RunState(run_id="r", iteration=4)
    seen: list[str] = []
    ran: list[int] = []

    def iteration(ctx, state, step, attempt):
        ran.append(attempt)
        if attempt == 0:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        return after

    monkeypatch.setattr(training, "iteration", iteration)
    monkeypatch.setattr(training, "wait_for_prefect_api", lambda: seen.append("waited") or 0.0)
    monkeypatch.setattr(training, "read_committed_state",
                        lambda store, run_id: after if committed_before_failing else before)
    monkeypatch.setattr(training, "restart_workers", lambda ctx: seen.append("restarted") or ctx)
    monkeypatch.setattr(training, "restore_weights", lambda ctx, state: seen.append(f"restored {state.iteration}"))
    monkeypatch.setattr(training, "rollout_first", lambda ctx: None)
    monkeypatch.setattr(training, "say", lambda line: None)
    monkeypatch.setattr(training, "complete_committed_subflow",
                        lambda step, since, line: seen.append(f"completed iter-{step:04d}"))
    ctx = SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(iteration_retries=2)), store=None,
                          run_id="r")
    _, state = training.run_iteration(ctx, before, 3)
    assert state == after
    if committed_before_failing:
        assert ran == [0] and seen == ["waited", "completed iter-0003", "restarted", "restored 4"]
    else:
        assert ran == [0, 1] and seen == ["waited", "restarted", "restored 3"]


@pytest.mark.slow
def test_the_subflow_an_outage_failed_after_its_commit_ends_completed(prefect_api):
    """The outage test once ended with `iter-0002` Failed: the server went away after that iteration's commit, so
    it was kept, not run again, and nothing ended its subflow otherwise. `complete_committed_subflow` sets the
    failed try's subflow Completed with the run's line; an earlier try of the same iteration and another
    iteration's subflow keep their states. Real subflows on the session's Prefect server.

    Marked slow because it needs the session's Prefect server (`prefect_api`, 15-35 s to start here, paid by the
    first test on each xdist worker that asks for it); this test's own part is ~3 s."""
    from datetime import datetime, timezone

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    @flow(flow_run_name="iter-{step:04d}", persist_result=False)
    def failed_by_the_outage(step: int) -> None:
        raise httpx.ConnectError("[Errno 111] Connection refused")

    @flow(name="tailflow-outage-parent", persist_result=False)
    def run() -> int:
        failed_by_the_outage(2, return_state=True)  # an earlier try of iteration 2
        since = datetime.now(timezone.utc)
        failed_by_the_outage(2, return_state=True)  # the try that committed, then failed
        failed_by_the_outage(3, return_state=True)
        return prefect_outage.complete_committed_subflow(2, since, "[tailflow] iter 0002: committed before it failed")

    state = run(return_state=True)
    assert state.result() == 1
    with get_client(sync_client=True) as client:
        subflows = client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(
            any_=[state.state_details.flow_run_id])), sort=FlowRunSort.START_TIME_ASC)
    assert [(run.name, run.state.type.value) for run in subflows] == [
        ("iter-0002", "FAILED"), ("iter-0002", "COMPLETED"), ("iter-0003", "FAILED")]
    assert subflows[1].state.message == "[tailflow] iter 0002: committed before it failed"


@pytest.mark.slow
def test_a_prefect_server_stopped_and_restarted_during_a_run_loses_and_repeats_no_iteration(tmp_path):
    """A `tailflow train` run against a Prefect server of its own; in iteration 2's round the server is stopped
    for 15 s and started again on the same port and database. Prefect's client retries once only here
    (PREFECT_CLIENT_MAX_RETRIES=1, ~2 s; the default rides ~1 minute out), so the run's requests fail during the
    outage: the run must go on by itself and end with iterations 0..3 committed once each, every metrics row
    once, one Completed `iter-NNNN` subflow per iteration (an attempt the outage failed before its commit, if
    any, ended Failed; one it failed after its commit ends Completed, `complete_committed_subflow`).
    Costs ~80 s here (a server started twice, one run of 4 iterations, Ray and its actors, the outage): the
    server must be this test's own to be stopped, and the run a process of its own to go on without it."""
    server = PrefectServer(tmp_path / "prefect")
    (tmp_path / "prefect").mkdir()
    server.start()
    config = run_config(tmp_path / "store")
    config["train"].update(iterations=4, num_workers=1, eval_every=100)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = dict(server.env, PREFECT_CLIENT_MAX_RETRIES="1", TAILFLOW_PROGRESS_EVERY_S="0")
    env.pop("TAILFLOW_FAULT", None)
    process = subprocess.Popen([sys.executable, "-m", "tailflow.cli", "train", "-c", str(tmp_path / "run.yaml"),
                                "--run-id", "outage"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    lines: list[str] = []
    outage = threading.Thread(target=lambda: (server.stop(), time.sleep(15), server.start()))
    try:
        for line in process.stdout:
            lines.append(line)
            if not outage.is_alive() and "iter 0002 round" in line and server.starts == 1:
                outage.start()
        code = process.wait(timeout=600)
        outage.join()
        output = "".join(lines)
        assert code == 0, output[-4000:]
        assert server.starts == 2, "the outage never came: no round line of iteration 2"
        assert "the Prefect server did not answer" in output, output[-4000:]  # it reached the run

        state, rows = outcome(tmp_path / "store", "outage")
        assert state.iteration == 4 and [row["iteration"] for row in rows] == [0, 1, 2, 3]
        from prefect.client.orchestration import SyncPrefectClient

        with SyncPrefectClient(server.url) as client:
            runs = client.read_flow_runs()
        subflows = sorted((run.name, run.state.type.value) for run in runs if run.name.startswith("iter-"))
        completed = [name for name, state_type in subflows if state_type == "COMPLETED"]
        assert completed == ["iter-0000", "iter-0001", "iter-0002", "iter-0003"], subflows  # one per iteration
        assert all(state_type in ("COMPLETED", "FAILED") for _, state_type in subflows), subflows  # none left open
    finally:
        if process.poll() is None:
            process.kill()
        server.stop()
